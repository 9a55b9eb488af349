"""Property-based tests of the SSE parser beyond tests/test_load_sse.py (which covers random bytes
and byte mutations of a valid stream): well-formed SSE framing around *structurally wrong* OpenAI
chunks (every field of a random JSON type), and split invariance of the decoder on random bytes.

Properties: the parser never reaches its defensive "parser error" path (an internal exception
caught there is a bug even though nothing raises), the chunk counts it returns add up to
``output_chunks``, ``classify`` yields one of the documented classes, and the way a body is cut
into network reads never changes the result.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from chaoslib_infer.measure.sse import SSEDecoder, StreamParser

CLASSES = (None, "stream_error", "garbled", "empty", "truncated")

json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def _maybe(value: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(value, json_values)


# chat/completions chunk shapes where any field may have the wrong type
delta = st.fixed_dictionaries(
    {},
    optional={
        "role": _maybe(st.just("assistant")),
        "content": _maybe(st.text(max_size=8)),
        "reasoning_content": _maybe(st.text(max_size=8)),
        "tool_calls": _maybe(
            st.lists(st.dictionaries(st.text(max_size=5), json_values, max_size=2), max_size=2)
        ),
    },
)
choice = st.fixed_dictionaries(
    {},
    optional={
        "index": _maybe(st.integers(0, 3)),
        "delta": _maybe(delta),
        "text": _maybe(st.text(max_size=8)),
        "finish_reason": _maybe(st.sampled_from(["stop", "length", None])),
    },
)
chunk = st.fixed_dictionaries(
    {},
    optional={
        "id": _maybe(st.text(max_size=8)),
        "object": _maybe(st.sampled_from(["chat.completion.chunk", "text_completion"])),
        "choices": _maybe(st.lists(_maybe(choice), max_size=3)),
        "usage": _maybe(
            st.fixed_dictionaries(
                {}, optional={"completion_tokens": _maybe(st.integers(-5, 10**6))}
            )
        ),
        "error": _maybe(st.dictionaries(st.text(max_size=6), json_values, max_size=2)),
    },
)
event_data = st.one_of(
    chunk.map(lambda c: json.dumps(c, allow_nan=True)),
    json_values.map(lambda v: json.dumps(v, allow_nan=True)),
    st.just("[DONE]"),
    st.text(max_size=20).filter(lambda t: "\n" not in t and "\r" not in t),
)


def _body(events: list[tuple[str | None, str]], eol: bytes) -> bytes:
    out = b""
    for name, data in events:
        if name is not None:
            out += b"event: " + name.encode() + eol
        out += b"data: " + data.encode("utf-8", "surrogatepass") + eol + eol
    return out


def _splits(body: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(body) + 1) for c in cuts})
    parts, last = [], 0
    for p in points:
        parts.append(body[last:p])
        last = p
    parts.append(body[last:])
    return parts


def _run(parts: list[bytes]) -> tuple[StreamParser, int]:
    p = StreamParser()
    n = sum(p.feed(part) for part in parts)
    n += p.close()
    return p, n


@settings(max_examples=400, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([None, None, None, "error", "message"]), event_data), max_size=8
    ),
    st.sampled_from([b"\n", b"\r\n", b"\r"]),
    st.lists(st.integers(0, 10**6), max_size=6),
)
def test_wrongly_typed_chunks_never_reach_the_defensive_path(
    events: list[tuple[str | None, str]], eol: bytes, cuts: list[int]
) -> None:
    body = _body(events, eol)
    whole, n_whole = _run([body])
    assert not (whole.garbled or "").startswith("parser error"), (whole.garbled, body[:300])
    assert n_whole == whole.output_chunks >= 0
    assert whole.text_len >= 0
    klass, message = whole.classify()
    assert klass in CLASSES
    assert (klass is None) == (message is None)
    # how the body is cut into reads never changes the outcome
    split, n_split = _run(_splits(body, cuts))
    assert n_split == n_whole
    assert split.classify() == (klass, message)
    assert (split.done, split.finish_reason, split.usage_tokens, split.text_len) == (
        whole.done,
        whole.finish_reason,
        whole.usage_tokens,
        whole.text_len,
    )


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=300), st.lists(st.integers(0, 10**6), max_size=8))
def test_decoder_is_split_invariant_on_random_bytes(body: bytes, cuts: list[int]) -> None:
    def events(parts: list[bytes]) -> list[tuple[str, str, str | None]]:
        d = SSEDecoder()
        out = []
        for part in parts:
            out += d.feed(part)
        out += d.close()
        return [(e.event, e.data, getattr(e, "id", None)) for e in out]

    assert events(_splits(body, cuts)) == events([body])
