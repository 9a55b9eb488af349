"""SSE parser: arbitrary byte splits, classification, robustness."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chaoslib_infer.load.fakeserver import stream_bytes
from chaoslib_infer.measure.sse import SSEDecoder, StreamParser


def parse(chunks: list[bytes]) -> tuple[StreamParser, int]:
    p = StreamParser()
    n = sum(p.feed(c) for c in chunks)
    n += p.close()
    return p, n


CJK_STREAM = b"".join(stream_bytes("chat", tokens=5, text="你好, 世界 🙂"))


def test_every_two_way_byte_split_of_cjk_stream() -> None:
    whole, n_whole = parse([CJK_STREAM])
    assert whole.classify() == (None, None)
    assert n_whole == 5 and whole.text_len == 5 * len("你好, 世界 🙂")
    assert whole.usage_tokens == 5 and whole.finish_reason == "length" and whole.done
    for i in range(len(CJK_STREAM) + 1):
        p, n = parse([CJK_STREAM[:i], CJK_STREAM[i:]])
        assert (p.classify(), n, p.text_len) == ((None, None), 5, whole.text_len), i


def test_byte_by_byte_and_random_splits() -> None:
    p, n = parse([CJK_STREAM[i : i + 1] for i in range(len(CJK_STREAM))])
    assert p.classify() == (None, None) and n == 5
    rng = random.Random(3)
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(CJK_STREAM)), 6))
        parts = [
            CJK_STREAM[a:b] for a, b in zip([0, *cuts], [*cuts, len(CJK_STREAM)], strict=False)
        ]
        p, n = parse(parts)
        assert p.classify() == (None, None) and n == 5


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"])
def test_line_endings_split_anywhere(eol: bytes) -> None:
    data = CJK_STREAM.replace(b"\n", eol)
    for i in range(0, len(data) + 1, 7):
        p, n = parse([data[:i], data[i:]])
        assert p.classify() == (None, None) and n == 5


def test_role_only_and_usage_chunks_are_not_output() -> None:
    data = stream_bytes("chat", tokens=3)
    p = StreamParser()
    assert p.feed(data[0]) == 0  # role-only chunk
    assert p.feed(data[1]) == 1
    p.feed(b"".join(data[2:]))
    p.close()
    assert p.output_chunks == 3 and p.classify() == (None, None)


def test_completions_stream() -> None:
    p, n = parse([b"".join(stream_bytes("completions", tokens=4))])
    assert n == 4 and p.classify() == (None, None)


def test_sse_decoder_fields_and_comments() -> None:
    d = SSEDecoder()
    evs = d.feed(b": ping\n\nevent: x\nid: 7\ndata: a\ndata:b\n\ndata: c")
    assert [(e.event, e.data, e.id) for e in evs] == [("x", "a\nb", "7")]
    evs = d.close()
    assert [e.data for e in evs] == [] and d.partial_tail


def cls(data: bytes) -> str | None:
    p, _ = parse([data])
    return p.classify()[0]


def _ev(s: str) -> bytes:
    return f"data: {s}\n\n".encode()


def test_classification() -> None:
    good = stream_bytes("chat", tokens=3)
    assert cls(b"".join(good)) is None
    # error object inside a 200 stream
    assert cls(b"".join(good[:2]) + _ev('{"error": {"message": "boom"}}')) == "stream_error"
    assert cls(_ev('{"object": "error", "message": "x"}')) == "stream_error"
    assert cls(b"event: error\ndata: overloaded\n\n") == "stream_error"
    fin_err = _ev('{"choices":[{"delta":{"content":"a"},"finish_reason":"abort"}]}')
    assert cls(fin_err + b"data: [DONE]\n\n") == "stream_error"
    assert cls(b'{"error": {"message": "not sse"}}') == "stream_error"
    # garbled
    assert (
        cls(b"".join(good[:2]) + b'data: {"choices":[{"delta":{"content":"\xff"}}]}\n\n')
        == "garbled"
    )
    assert cls(b"".join(good[:2]) + _ev('{"choices": [')) == "garbled"
    assert (
        cls(_ev('{"choices":[{"delta":{"content":"\\ufffd"}}]}') + b"".join(good[1:])) == "garbled"
    )
    assert cls(b"".join(good[:2]) + _ev("[1, 2]") + b"".join(good[2:])) == "garbled"
    assert cls(b"<html>bad gateway</html>") == "garbled"
    assert cls(b"".join(good)[:-3] + b"\xe4") == "garbled"  # cut inside a UTF-8 character
    # empty
    assert cls(b"") == "empty"
    assert cls(b": keepalive\n\n") == "empty"
    assert cls(b"".join(stream_bytes("chat", tokens=0))) == "empty"
    # truncated
    assert cls(b"".join(stream_bytes("chat", tokens=3, finish=False, done=False))) == "truncated"
    assert cls(b"".join(stream_bytes("chat", tokens=3, done=False))) == "truncated"
    assert cls(b"".join(stream_bytes("chat", tokens=3, finish=False))) == "truncated"


def test_cut_mid_event_is_truncated() -> None:
    good = stream_bytes("chat", tokens=3)
    p, _ = parse([b"".join(good[:3]) + b'data: {"choi'])
    assert p.classify()[0] == "truncated" and p.sse.partial_tail


def test_done_without_trailing_blank_line_is_accepted() -> None:
    data = b"".join(stream_bytes("chat", tokens=2))[:-1]  # "data: [DONE]\n"
    assert cls(data) is None


def test_usage_fallback() -> None:
    p, n = parse([b"".join(stream_bytes("chat", tokens=3, usage=False))])
    assert p.usage_tokens is None and n == 3 and p.classify() == (None, None)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=64), max_size=12))
def test_never_raises_on_random_bytes(chunks: list[bytes]) -> None:
    p = StreamParser()
    for c in chunks:
        p.feed(c)
    p.close()
    p.close()
    klass, _ = p.classify()
    assert klass in (None, "stream_error", "garbled", "empty", "truncated")


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_never_raises_on_mutated_streams(data: st.DataObject) -> None:
    base = bytearray(CJK_STREAM)
    for _ in range(data.draw(st.integers(0, 8))):
        i = data.draw(st.integers(0, len(base) - 1))
        base[i] = data.draw(st.integers(0, 255))
    p = StreamParser()
    p.feed(bytes(base))
    p.close()
    p.classify()


def test_deep_nesting_and_huge_numbers_do_not_raise() -> None:
    assert cls(_ev("[" * 100000)) == "garbled"
    assert cls(_ev('{"usage": {"completion_tokens": ' + "9" * 5000 + "}}")) == "garbled"
