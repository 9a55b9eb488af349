"""Hand-made streams with known answers: every metric under every tool's definition, every class."""

from __future__ import annotations

import json

import pytest

from chaoslib_infer.measure.definitions import (
    definitions_from_record,
    definitions_from_timeline,
    export_definitions,
    timeline_from_blocks,
)


def ev(obj: object) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"


def role() -> bytes:
    return ev({"choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]})


def tok(text: str) -> bytes:
    return ev({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]})


def fin(reason: str = "stop") -> bytes:
    return ev({"choices": [{"index": 0, "delta": {}, "finish_reason": reason}]})


def usage(n: int) -> bytes:
    return ev({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": n}})


DONE = b"data: [DONE]\n\n"


def approx(x: float | None) -> object:
    return pytest.approx(x, abs=1e-9)


def test_role_chunk_first_every_definition() -> None:
    # sent at 0; role at 0.5; tokens at 1.0, 1.2, 1.6; finish 1.7; usage 1.8; [DONE] 1.9
    blocks = [
        (0.5, role()),
        (1.0, tok("a")),
        (1.2, tok("b")),
        (1.6, tok("c")),
        (1.7, fin()),
        (1.8, usage(3)),
        (1.9, DONE),
    ]
    d = definitions_from_timeline(timeline_from_blocks(0.0, blocks))
    assert d["error_class"] is None and d["usage_mismatch"] is False
    o = d["ours"]
    assert o["ttft"] == approx(1.0)  # the role chunk is not output
    assert o["itl"] == [approx(0.2), approx(0.4)]
    assert o["tpot"] == approx(0.3)  # (1.6 - 1.0) / (3 - 1)
    assert o["e2e"] == approx(1.9)
    assert (o["output_tokens"], o["tokens_source"]) == (3, "usage")
    v = d["vllm"]
    assert v["ttft"] == approx(0.5)  # vLLM's bench counts the role chunk
    assert v["itl"] == [approx(0.5), approx(0.2), approx(0.4), approx(0.1)]  # finish counts
    assert v["e2e"] == approx(1.8)  # last data event (usage), not [DONE]
    assert v["tpot"] == approx((1.8 - 0.5) / 2)
    a = d["aiperf"]
    assert a["ttft"] == approx(1.0)
    assert a["e2e"] == approx(1.6)
    assert a["itl"] == approx(0.3)  # (1.6 - 1.0) / (3 - 1)
    assert a["icl"] == [approx(0.2), approx(0.4)]
    g = d["guidellm"]
    assert g["ttft"] == approx(1.0)
    assert g["itl"] == approx(0.3)
    assert g["tpot"] == approx(1.6 / 3)  # includes TTFT
    assert g["e2e"] == approx(1.9)


def test_usage_counts_tokens_when_chunks_carry_several() -> None:
    blocks = [(0.1, tok("ab")), (0.3, tok("cd")), (0.4, fin()), (0.4, usage(5)), (0.5, DONE)]
    d = definitions_from_timeline(timeline_from_blocks(0.0, blocks))
    assert d["ours"]["output_tokens"] == 5
    assert d["ours"]["tpot"] == approx(0.2 / 4)
    assert d["guidellm"]["tpot"] == approx(0.3 / 5)


def test_missing_usage_falls_back_to_chunk_count() -> None:
    blocks = [(0.2, role()), (0.3, tok("x")), (0.5, tok("y")), (0.6, fin()), (0.7, DONE)]
    d = definitions_from_timeline(timeline_from_blocks(0.0, blocks))
    assert d["error_class"] is None
    assert (d["ours"]["output_tokens"], d["ours"]["tokens_source"]) == (2, "chunks")
    assert d["ours"]["tpot"] == approx(0.2)
    assert d["vllm"]["e2e"] == approx(0.6)  # finish chunk is the last data event


def test_split_multibyte_character_is_not_garbled() -> None:
    body = role() + tok("日本") + fin() + DONE
    cut = body.index("日".encode()) + 1  # inside the 3-byte character
    blocks = [(0.1, body[:cut]), (0.4, body[cut:])]
    d = definitions_from_timeline(timeline_from_blocks(0.0, blocks))
    assert d["error_class"] is None
    assert d["ours"]["ttft"] == approx(0.4)  # the token completes with the second block
    assert d["vllm"]["ttft"] == approx(0.1)


def test_merged_frames_share_a_time_and_split_frame_gets_the_later_one() -> None:
    merged = role() + tok("a") + tok("b")
    second = tok("c")
    blocks = [
        (0.3, merged),
        (0.5, second[:7]),
        (0.8, second[7:] + fin()),
        (0.9, usage(3) + DONE),
    ]
    d = definitions_from_timeline(timeline_from_blocks(0.0, blocks))
    assert d["error_class"] is None
    assert d["ours"]["itl"] == [approx(0.0), approx(0.5)]
    assert d["ours"]["ttft"] == approx(0.3)
    assert d["ours"]["e2e"] == approx(0.9)


@pytest.mark.parametrize(
    ("blocks", "cls", "needle"),
    [
        ([(0.1, role()), (0.2, tok("a")), (0.3, ev({"error": {"message": "boom"}}))], "stream_error", "boom"),
        ([(0.1, tok("a")), (0.2, fin("abort")), (0.3, DONE)], "stream_error", "abort"),
        ([(0.1, tok("a") + fin())], "truncated", "[DONE]"),
        ([(0.1, tok("a")), (0.2, DONE)], "truncated", "finish_reason"),
        ([(0.1, role() + fin() + DONE)], "empty", "no generated output"),
        ([], "empty", "empty response body"),
        ([(0.1, tok("a") + b"data: {not json\n\n" + fin() + DONE)], "garbled", "invalid JSON"),
        ([(0.1, tok("a\ufffd") + fin() + DONE)], "garbled", "U+FFFD"),
        ([(0.1, b'data: {"choices":[{"delta":{"content":"\xff"}}]}\n\n' + fin() + DONE)], "garbled", "UTF-8"),
        ([(0.1, b"<html>bad gateway</html>")], "garbled", "not an SSE"),
    ],
)  # fmt: skip
def test_error_classes(blocks: list[tuple[float, bytes]], cls: str, needle: str) -> None:
    d = definitions_from_timeline(timeline_from_blocks(0.0, blocks))
    assert d["error_class"] == cls
    assert needle in (d["error"] or "")


def test_error_in_200_keeps_timing_of_tokens_before_it() -> None:
    blocks = [(0.1, role()), (0.2, tok("a")), (0.35, tok("b")), (0.4, ev({"object": "error"}))]
    d = definitions_from_timeline(timeline_from_blocks(0.0, blocks))
    assert d["error_class"] == "stream_error"
    assert d["ours"]["itl"] == [approx(0.15)]


def test_usage_mismatch_flagged() -> None:
    blocks = [(0.1, tok("a")), (0.2, tok("b")), (0.3, tok("c")), (0.3, fin() + usage(2) + DONE)]
    d = definitions_from_timeline(timeline_from_blocks(0.0, blocks))
    assert d["usage_mismatch"] is True
    assert d["error_class"] is None


def _record(**kw: object) -> dict[str, object]:
    rec: dict[str, object] = {
        "request_id": "r",
        "attempt": 1,
        "final": True,
        "intended_at": 100.0,
        "sent_at": 100.0,
        "status": 200,
        "ok": True,
        "error_class": None,
        "error": None,
        "first_byte_at": 100.5,
        "first_token_at": 101.0,
        "chunk_times": [101.0, 101.2, 101.6],
        "end_at": 101.9,
        "output_tokens": 3,
        "tokens_source": "usage",
        "replica": None,
        "text_len": 3,
    }
    rec.update(kw)
    return rec


def test_definitions_from_record_matches_raw_stream_where_exact() -> None:
    d = definitions_from_record(_record())
    assert d["approximate"] is True
    assert d["ours"]["ttft"] == approx(1.0) and d["ours"]["tpot"] == approx(0.3)
    assert d["vllm"]["ttft"] == approx(0.5)  # first_byte_at stands for the role chunk
    assert d["aiperf"]["itl"] == approx(0.3)
    assert d["guidellm"]["tpot"] == approx(1.6 / 3)


def test_export_aggregates_and_censors() -> None:
    recs = [
        _record(),
        _record(sent_at=200.0, first_byte_at=200.2, chunk_times=[200.4, 200.5], end_at=200.6,
                output_tokens=2),
        _record(ok=False, error_class="http_5xx", chunk_times=[], output_tokens=0),
    ]  # fmt: skip
    out = export_definitions(recs)
    assert (out["requests"], out["ok"]) == (3, 2)
    assert out["censored_fraction"] == pytest.approx(1 / 3)
    assert out["output_tokens"] == 5
    ours = out["tools"]["ours"]
    assert ours["itl"]["n"] == 3  # pooled raw gaps: 0.2, 0.4, 0.1
    assert ours["ttft"]["mean"] == pytest.approx(0.7)
    assert out["tools"]["aiperf"]["itl"]["n"] == 2  # one average per request
    assert out["tools"]["vllm"]["ttft"]["p99"] == pytest.approx(0.5, rel=1e-3)
