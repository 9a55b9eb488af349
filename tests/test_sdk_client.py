"""The OpenAI SDK as the load's client (issue 23 item 3) and the provider-error figures (item 4),
at unit level: the SDK over an in-process engine (ASGI, no sockets), the figures on synthetic
ledgers. The lab test (our client and the SDK meeting 429s through HAProxy) is
``test_provider_errors_lab.py``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from chaoslib_infer.lab.engine import EngineConfig, build_app
from chaoslib_infer.load.client import LoadSpec, build_body
from chaoslib_infer.load.records import read_records
from chaoslib_infer.load.sdkclient import SdkSession, describe_client, write_prior_attempts
from chaoslib_infer.load.spec import LoadCounters
from chaoslib_infer.measure.retryafter import provider_error_figures

pytest.importorskip("openai")


def _sdk_requests(
    tmp_path: Path, fault: dict[str, Any] | None, n: int, **spec_kw: Any
) -> tuple[list[list[dict[str, Any]]], list[dict[str, Any]], SdkSession]:
    """``n`` logical requests through the SDK to an in-process engine armed with ``fault``:
    the records of each (prior attempts first) and the engine ledger."""
    ledger = tmp_path / "ledger.jsonl"
    app = build_app(
        EngineConfig(load_delay_s=0.0, warmup_requests=0, itl_s=0.0, ledger=ledger, model="sim")
    )
    spec = LoadSpec(url="http://e", client="openai-sdk", max_tokens=5, **spec_kw)
    session = SdkSession(spec)
    hx = session.transport.httpx
    session = SdkSession(spec, inner_transport=hx.ASGITransport(app=app))
    out: list[list[dict[str, Any]]] = []

    async def main() -> None:
        import random

        async with hx.AsyncClient(transport=hx.ASGITransport(app=app), base_url="http://e") as c:
            if fault is not None:
                assert (await c.post("/admin/faults", json=fault)).status_code == 200
        async with session:
            for i in range(n):
                body = json.dumps(build_body(spec, random.Random(i))).encode()
                rec = await session.send_attempt(spec, body, f"req-{i}", 1, None)
                out.append([*rec.get("prior_attempts", []), rec])
        app.state.engine.close()

    asyncio.run(main())
    lines = [json.loads(x) for x in ledger.read_text().splitlines() if x.strip()]
    return out, lines, session


def test_a_healthy_request_is_one_record_of_our_shape(tmp_path: Path) -> None:
    [[rec]], ledger, session = _sdk_requests(tmp_path, None, 1)
    assert rec["ok"] and rec["final"] and rec["attempt"] == 1 and rec["status"] == 200
    assert rec["output_tokens"] == 5 and rec["tokens_source"] == "usage"
    assert len(rec["chunk_times"]) == 5 and rec["first_token_at"] == rec["chunk_times"][0]
    assert rec["sent_at"] <= rec["first_byte_at"] <= rec["first_token_at"] <= rec["end_at"]
    assert rec["time_source"] == "loop" and rec["client"] == "openai-sdk"
    assert rec["replica"] == "r0"
    assert [e["request_id"] for e in ledger if e["event"] == "generation"] == ["req-0"]
    client = describe_client(session.spec, session)
    assert client["name"] == "openai-sdk" and client["version"]
    assert client["policy"] == {"max_retries": 2, "timeout_s": 600, "connect_timeout_s": 5.0}


def test_sdk_retries_are_records_and_honour_retry_after(tmp_path: Path) -> None:
    """Every arrival answered 429 with Retry-After 1 s: the SDK (max_retries 2) retries twice,
    each after 1 s, then gives up; three records per request, the ledger agrees."""
    fault = {"mode": "http_error", "how": "rate_limit", "retry_after": 1}
    recs, ledger, _ = _sdk_requests(tmp_path, fault, 2)
    for rs in recs:
        assert [r["attempt"] for r in rs] == [1, 2, 3]
        assert [r["final"] for r in rs] == [False, False, True]
        assert [r["error_class"] for r in rs] == ["http_429"] * 3
        assert [r["retry_after_s"] for r in rs] == [1.0] * 3
        assert len({r["request_id"] for r in rs}) == 1
        gaps = [b["sent_at"] - a["end_at"] for a, b in zip(rs, rs[1:], strict=False)]
        assert all(1.0 <= g < 1.5 for g in gaps), gaps
    figs = provider_error_figures(ledger, {"req-0", "req-1"})
    assert figs["retry_after_retried"] == 4 and figs["retry_after_honoured"] == 4
    assert figs["retry_after_honoured_share"] == 1.0
    assert all(1.0 <= w < 1.5 and ra == 1.0 for w, ra in figs["retry_after_waits_s"])
    assert figs["arrivals"] == 6 and figs["load_amplification"] == 3.0
    assert figs["gave_up_retryable"] == 2 and figs["retried_final"] == 0
    # the records count what the engine saw: no SDK retry is silent
    assert sum(len(rs) for rs in recs) == figs["arrivals"]


def test_sdk_gives_up_on_a_retryable_400_and_never_retries_a_final_one(tmp_path: Path) -> None:
    recs, ledger, _ = _sdk_requests(
        tmp_path, {"mode": "http_error", "how": "closed_endpoint", "profile": "ark"}, 2
    )
    assert [[r["error_class"] for r in rs] for rs in recs] == [["http_4xx"], ["http_4xx"]]
    assert "InvalidEndpoint.ClosedEndpoint" in recs[0][0]["error"]
    figs = provider_error_figures(ledger)
    assert figs["gave_up_retryable"] == 2 and figs["retried_final"] == 0
    assert figs["retry_after_honoured_share"] is None  # nothing retried: unmeasured, never 1


def test_sdk_max_retries_from_the_plan(tmp_path: Path) -> None:
    fault = {"mode": "http_error", "how": "unavailable", "retry_after": 0}
    recs, ledger, session = _sdk_requests(tmp_path, fault, 1, sdk_max_retries=0)
    assert [r["status"] for r in recs[0]] == [503] and recs[0][0]["retry_after_s"] is None
    assert session.policy()["max_retries"] == 0
    assert provider_error_figures(ledger)["gave_up_retryable"] == 1


def test_prior_attempts_are_written_and_counted() -> None:
    prior = [{"error_class": "http_429", "final": False}, {"error_class": "http_5xx"}]
    rec = {"ok": True, "error_class": None, "prior_attempts": prior}
    written: list[dict[str, Any]] = []
    c = LoadCounters()
    assert write_prior_attempts(rec, lambda r: written.append(r) is None, c)
    assert written == prior and "prior_attempts" not in rec
    assert (c.attempts, c.retries, c.failed, c.retried_requests, c.succeeded_after_retry) == (
        2, 2, 2, 1, 1,
    )  # fmt: skip
    assert c.errors_by_class == {"http_429": 1, "http_5xx": 1}
    assert not write_prior_attempts({"ok": True, "prior_attempts": prior}, lambda r: False, c)


@pytest.mark.parametrize(
    ("kw", "msg"),
    [
        ({"client": "curl"}, "client must be"),
        ({"client": "openai-sdk", "retry_attempts": 3}, "retries by itself"),
        ({"client": "openai-sdk", "api": "completions"}, "chat completions only"),
        ({"client": "openai-sdk", "sdk_max_retries": -1}, "sdk_max_retries"),
        ({"client": "openai-sdk", "sdk_timeout_s": 0}, "sdk_timeout_s"),
        ({"sdk_max_retries": 1}, "need client: openai-sdk"),
    ],
)
def test_spec_validation(kw: dict[str, Any], msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        LoadSpec(url="http://127.0.0.1:1", **kw)


def test_sdk_deadline_bounds_the_drain() -> None:
    spec = LoadSpec(
        url="http://127.0.0.1:1", client="openai-sdk", sdk_timeout_s=10, sdk_max_retries=1
    )
    assert spec.max_logical_s() == pytest.approx(2 * (10 + 3.0) + 120.0)


# ---------------------------------------------------------------------------- figures, synthetic


def _f(t: float, rid: str, status: int, ra: int | None, retryable: bool = True) -> dict[str, Any]:
    answer = {"status": status, "retryable": retryable, "retry_after_s": ra}
    return {"t": t, "event": "fault", "mode": "http_error", "request_id": rid, "answer": answer}


def _g(t: float, rid: str) -> dict[str, Any]:
    return {"t": t, "event": "generation", "request_id": rid}


def test_figures_on_a_synthetic_ledger() -> None:
    ledger = [
        _f(10.0, "a", 429, 2), _g(12.01, "a"),            # honoured (2.01 s >= 2 s)
        _f(10.0, "b", 429, 2), _g(10.3, "b"),             # not honoured (0.3 s)
        _f(11.0, "c", 400, None, retryable=False), _g(11.2, "c"),  # a final 400 retried
        _f(11.0, "d", 503, 1),                            # gave up on a retryable answer
        _g(13.0, "e"),
        {"t": 13.0, "event": "fault", "mode": "hang", "request_id": "f"},  # other mode: skipped
        _g(14.0, "z"),                                    # another client's request
    ]  # fmt: skip
    figs = provider_error_figures(ledger, {"a", "b", "c", "d", "e", "f"})
    assert figs["error_answers"] == 4 and figs["retry_after_answers"] == 3
    assert figs["retry_after_retried"] == 2 and figs["retry_after_honoured"] == 1
    assert figs["retry_after_honoured_share"] == 0.5
    assert figs["retry_after_waits_s"] == [[2.01, 2.0], [0.3, 2.0]]
    assert (figs["final_answers"], figs["retried_final"], figs["gave_up_retryable"]) == (1, 1, 1)
    assert figs["requests"] == 5 and figs["arrivals"] == 8
    assert figs["load_amplification"] == 1.6 and figs["max_arrivals"] == 2
    empty = provider_error_figures([])
    assert empty["load_amplification"] is None and empty["retry_after_honoured_share"] is None


def test_records_file_unchanged_shape(tmp_path: Path) -> None:
    """An SDK record passes the records reader like ours (one JSON line, known fields)."""
    from chaoslib_infer.load.records import OPTIONAL_FIELDS, RECORD_FIELDS, RecordWriter

    [[rec]], _, _ = _sdk_requests(tmp_path, None, 1)
    with RecordWriter(tmp_path / "r.jsonl") as w:
        w.write(rec)
    [back] = read_records(tmp_path / "r.jsonl")
    assert [k for k in back if k not in OPTIONAL_FIELDS] == list(RECORD_FIELDS)


def test_our_client_honours_retry_after_only_when_asked() -> None:
    import random

    from chaoslib_infer.load.spec import retry_backoff_delay

    ignore = LoadSpec(url="http://127.0.0.1:1", retry_attempts=3, retry_backoff_s=0.2)
    honour = LoadSpec(
        url="http://127.0.0.1:1", retry_attempts=3, retry_backoff_s=0.2, retry_after_max_s=5
    )
    assert retry_backoff_delay(ignore, 1, random.Random(1), 3.0) < 0.25  # its backoff alone
    assert retry_backoff_delay(honour, 1, random.Random(1), 3.0) == 3.0
    assert retry_backoff_delay(honour, 1, random.Random(1), 60.0) == 5.0  # capped
    assert retry_backoff_delay(honour, 1, random.Random(1), None) < 0.25
    assert honour.max_logical_s() == pytest.approx(3 * (30 + 0.5) + 5 + 5)
    with pytest.raises(ValueError, match="retry_after_max_s"):
        LoadSpec(url="http://127.0.0.1:1", retry_after_max_s=-1)


def test_a_stream_error_is_classified_and_never_retried_by_the_sdk(tmp_path: Path) -> None:
    """An error object inside the 200 stream: our parser's class, one attempt (the SDK retries
    only before a response starts)."""
    recs, ledger, _ = _sdk_requests(tmp_path, {"mode": "error_in_stream", "k": 1}, 1)
    [[rec]] = recs
    assert rec["error_class"] == "stream_error" and rec["status"] == 200 and rec["final"]
    assert len(rec["chunk_times"]) == 1
    assert [e["event"] for e in ledger if e.get("request_id") == "req-0"][:2] == [
        "fault", "generation",
    ]  # fmt: skip


def test_the_key_goes_to_the_sdk_not_as_a_header() -> None:
    spec = LoadSpec(url="http://127.0.0.1:1", client="openai-sdk",
                    headers={"authorization": "Bearer sk-test-1", "X-Team": "a"})  # fmt: skip
    session = SdkSession(spec)
    assert session.client.api_key == "sk-test-1"
    assert session.policy()["max_retries"] == 2
