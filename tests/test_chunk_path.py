"""The compiled chunk path (issue 24 item 1): ``measure._ssefast.FastStreamParser`` gives the same
parser state, hence the same records, as the pure-Python ``sse.StreamParser`` on the same bytes.

* a differential test over recorded streams (the fake server's streams of every shape and
  misbehaviour, the lab engine's completions and chat streams as the vLLM, TGI and Ark mimics send
  them), each cut into reads five ways, against the known truth of the clean ones;
* a hypothesis fuzz test over split points, malformed chunks (bad JSON, wrong types, stray
  fields, CR line ends, comments, bad UTF-8) and multi-byte characters cut across reads;
* the fast path really runs (the pure path is asked for no clean per-event read), the choice of
  path (``CHAOS_INFER_CHUNK_PATH``) and its errors, and the records naming the path.

Unit-level: no lab, no server.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chaoslib_infer.load.fakeserver import stream_bytes
from chaoslib_infer.measure import chunkpath
from chaoslib_infer.measure.sse import StreamParser

COMPILED, WHY_NOT = chunkpath.compiled_available()
needs_compiled = pytest.mark.skipif(
    not COMPILED, reason=f"compiled chunk path not built: {WHY_NOT}"
)
STREAMS = Path(__file__).parent / "data" / "streams"


def _fast() -> type[StreamParser]:
    from chaoslib_infer.measure._ssefast import FastStreamParser  # type: ignore[import-not-found]

    return FastStreamParser  # type: ignore[no-any-return]


def state(p: StreamParser) -> dict[str, Any]:
    """Everything a record or a classification can read from a parser, and the decoder's state."""
    d = p.sse
    return {
        "done": p.done,
        "finish_reason": p.finish_reason,
        "usage_tokens": p.usage_tokens,
        "usage_prompt_tokens": p.usage_prompt_tokens,
        "output_chunks": p.output_chunks,
        "text_len": p.text_len,
        "error": p.error,
        "garbled": p.garbled,
        "events": p.events,
        "saw_replacement": d.saw_replacement,
        "overlong": d.overlong,
        "unknown_lines": d.unknown_lines,
        "head": d.head,
        "partial_tail": d.partial_tail,
        "bytes_in": d.bytes_in,
    }


def run(cls: type[StreamParser], reads: list[bytes]) -> tuple[list[int], dict[str, Any]]:
    """Feed ``reads`` one by one, close, classify: the per-read chunk counts and the state."""
    p = cls()
    counts = [p.feed(r) for r in reads]
    counts.append(p.close())
    return counts, {**state(p), "classify": p.classify()}


def same(reads: list[bytes]) -> tuple[list[int], dict[str, Any]]:
    """Both paths on ``reads``; asserts they agree and returns the result."""
    want = run(StreamParser, reads)
    got = run(_fast(), reads)
    assert got == want, reads
    return got


def splits(body: bytes, events: list[bytes], seed: int) -> Iterator[list[bytes]]:
    """Five ways a body reaches the parser: whole, one event a read, two events a read, random
    cuts, and byte by byte (bodies under 2 KB)."""
    yield [body]
    yield list(events)
    yield [b"".join(events[i : i + 2]) for i in range(0, len(events), 2)]
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(body)), min(8, len(body) - 1))) if len(body) > 1 else []
    yield [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    if len(body) < 2048:
        yield [body[i : i + 1] for i in range(len(body))]


def _events(body: bytes) -> list[bytes]:
    """A recorded body cut after every blank line (LF or CRLF), as a server writes its events."""
    out, start = [], 0
    for i in range(len(body)):
        if body[i : i + 2] == b"\n\n" or body[i : i + 3] == b"\n\r\n":
            end = i + (2 if body[i + 1 : i + 2] == b"\n" else 3)
            out.append(body[start:end])
            start = end
    if start < len(body):
        out.append(body[start:])
    return [e for e in out if e]


# ---------------------------------------------------------------- recorded streams, with truth

#: (name, events, output chunks, classify) of the fake server's shapes; truth from its definition
FAKE: list[tuple[str, list[bytes], int, tuple[str | None, str | None] | str]] = [
    ("chat", stream_bytes("chat", 8), 8, (None, None)),
    ("completions", stream_bytes("completions", 32, " hello"), 32, (None, None)),
    ("cjk", stream_bytes("chat", 5, "你好, 世界 🙂"), 5, (None, None)),
    ("no-usage", stream_bytes("completions", 3, usage=False), 3, (None, None)),
    ("nodone", stream_bytes("chat", 3, done=False), 3, "truncated"),
    ("nofinish", stream_bytes("chat", 3, finish=False, done=False), 3, "truncated"),
    ("nocontent", stream_bytes("chat", 0), 0, "empty"),
    (
        "badjson",
        [*stream_bytes("chat", 2)[:2], b"data: {not json\n\n", *stream_bytes("chat", 2)[2:]],
        2,
        "garbled",
    ),
    (
        "garbled-utf8",
        [stream_bytes("chat", 1)[0], b'data: {"choices":[{"delta":{"content":"\xff\xfe"}}]}\n\n'],
        1,
        "garbled",
    ),
    (
        "error-object",
        [*stream_bytes("chat", 2)[:2], b'data: {"error": {"message": "overloaded"}}\n\n'],
        1,
        "stream_error",
    ),
    (
        "finish-abort",
        [
            *stream_bytes("completions", 2)[:2],
            b'data: {"choices":[{"text":"","finish_reason":"abort"}]}\n\n',
            b"data: [DONE]\n\n",
        ],
        2,
        ("stream_error", "finish_reason=abort"),
    ),
    (
        "event-error",
        [stream_bytes("chat", 1)[1], b"event: error\ndata: boom\n\n"],
        1,
        "stream_error",
    ),
    (
        "crlf-comments-bom",
        [b"\xef\xbb\xbf: keep-alive\r\n\r\n"]
        + [e.replace(b"\n", b"\r\n") for e in stream_bytes("completions", 4)],
        4,
        (None, None),
    ),
    (
        "tool-calls-reasoning",
        [
            b'data: {"choices":[{"delta":{"reasoning_content":"think"}}]}\n\n',
            b'data: {"choices":[{"delta":{"tool_calls":[{"function":{"arguments":"{}"}}]}}]}\n\n',
            b'data: {"choices":[{"delta":{},"finish_reason":"tool_calls"}]}\n\n',
            b"data: [DONE]\n\n",
            b'data: {"choices":[{"text":"after done"}]}\n\n',
        ],
        2,
        (None, None),
    ),
    (
        "multiline-data-id-retry",
        [
            b'id: 7\nretry: 10\ndata: {"choices":\ndata: [{"text":"a"}]}\n\n',
            b'data: {"choices":[{"text":"b","finish_reason":"stop"}]}\n\ndata: [DONE]\n\n',
        ],
        2,
        (None, None),
    ),
    (
        "truncated-mid-event",
        [*stream_bytes("completions", 3)[:3], b'data: {"choices":[{"te'],
        3,
        "truncated",
    ),
]


@needs_compiled
@pytest.mark.parametrize("name,events,chunks,cls", FAKE, ids=[f[0] for f in FAKE])
def test_differential_fake_streams(
    name: str, events: list[bytes], chunks: int, cls: tuple[str | None, str | None] | str
) -> None:
    body = b"".join(events)
    for k, reads in enumerate(splits(body, events, seed=len(name))):
        counts, st_ = same(reads)
        assert sum(counts) == chunks == st_["output_chunks"], (name, k)
        want = cls if isinstance(cls, tuple) else cls
        got = st_["classify"] if isinstance(cls, tuple) else st_["classify"][0]
        assert got == want, (name, k, st_["classify"])


def _recorded() -> list[Path]:
    return sorted(STREAMS.glob("*.sse"))


@needs_compiled
@pytest.mark.parametrize("path", _recorded(), ids=lambda p: p.stem)
def test_differential_recorded_engine_streams(path: Path) -> None:
    """Streams recorded from the lab engine (tests/data/streams/README.md says how); the truth
    is in the file's name: ``<profile>-<api>-<tokens>.sse``, a clean reply of that many chunks."""
    body = path.read_bytes()
    tokens = int(path.stem.rsplit("-", 1)[1])
    for reads in splits(body, _events(body), seed=tokens):
        counts, st_ = same(reads)
        assert sum(counts) == tokens and st_["classify"] == (None, None), path.name


def test_recorded_streams_are_there() -> None:
    assert len(_recorded()) >= 4, "tests/data/streams/*.sse missing"


@needs_compiled
def test_fast_path_runs_on_clean_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Clean one-event and many-event reads never reach the pure path; a read the fast path does
    not take (a cut inside an event) does, and the next clean read is fast again."""
    pure_feeds: list[bytes] = []
    orig = StreamParser.feed

    def counting(self: StreamParser, data: bytes) -> int:
        pure_feeds.append(data)
        return orig(self, data)

    monkeypatch.setattr(StreamParser, "feed", counting)
    events = stream_bytes("completions", 6, "été 🙂")
    p = _fast()()
    n = sum(p.feed(e) for e in events[:3]) + p.feed(b"".join(events[3:5]))
    assert n == 5 and pure_feeds == []
    cut = events[5][:9]
    n += p.feed(cut) + p.feed(events[5][9:])  # the rest of the event: still pure (buffered)
    assert pure_feeds == [cut, events[5][9:]]
    n += sum(p.feed(e) for e in events[6:])
    assert len(pure_feeds) == 2 and n == 6 and p.classify() == (None, None)


# ---------------------------------------------------------------- fuzz

json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
texts = st.text(alphabet=st.sampled_from('ab é中🙂\ufffd\\"\n'), max_size=6)
chunk = st.fixed_dictionaries(
    {},
    optional={
        "choices": st.one_of(
            st.lists(
                st.fixed_dictionaries(
                    {},
                    optional={
                        "delta": st.one_of(
                            st.fixed_dictionaries(
                                {},
                                optional={
                                    "content": st.one_of(texts, json_values),
                                    "reasoning": texts,
                                    "tool_calls": st.one_of(
                                        st.just([{"function": {"arguments": "{}"}}]), json_values
                                    ),
                                },
                            ),
                            json_values,
                        ),
                        "text": st.one_of(texts, json_values),
                        "finish_reason": st.sampled_from(
                            [None, "stop", "length", "error", "abort", ""]
                        ),
                    },
                ),
                max_size=2,
            ),
            json_values,
        ),
        "usage": st.one_of(
            st.fixed_dictionaries(
                {
                    "completion_tokens": st.integers(-2, 99) | json_values,
                    "prompt_tokens": st.integers(-2, 99) | json_values,
                }
            ),
            json_values,
        ),
        "error": json_values,
        "object": st.sampled_from(["text_completion", "error"]),
    },
)
raw_events = st.one_of(
    chunk.map(lambda c: b"data: " + json.dumps(c, ensure_ascii=False).encode() + b"\n\n"),
    chunk.map(lambda c: b"data: " + json.dumps(c).encode() + b"\r\n\r\n"),
    st.sampled_from(
        [
            b"data: [DONE]\n\n",
            b"data: {not json\n\n",
            b"data: [1, 2]\n\n",
            b": comment\n\n",
            b"event: error\ndata: x\n\n",
            b"data: \xe4\xb8\n\n",  # a character cut short: invalid UTF-8
            b"\xef\xbb\xbfdata: {}\n\n",
            b"data:{}\n",
            b"id: 1\n",
            b"\n",
            b"data: NaN\n\n",
            b'data: {"choices":[{"text":"\\ud800"}]}\n\n',  # a lone surrogate: orjson refuses
        ]
    ),
    st.binary(max_size=12),
)


@needs_compiled
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    events=st.lists(raw_events, max_size=10),
    cuts=st.lists(st.integers(0, 2000), max_size=8),
    per_event=st.booleans(),
)
def test_fuzz_same_state_any_split(events: list[bytes], cuts: list[int], per_event: bool) -> None:
    body = b"".join(events)
    if per_event:
        reads = [e for e in events if e]
    else:
        points = sorted({c % (len(body) + 1) for c in cuts})
        reads = [body[a:b] for a, b in zip([0, *points], [*points, len(body)], strict=True)]
    same(reads)


# ---------------------------------------------------------------- choice of path


def test_choice_of_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(chunkpath.ENV, "python")
    assert chunkpath.parser_class() is StreamParser and chunkpath.path() == "python"
    monkeypatch.setenv(chunkpath.ENV, "bogus")
    with pytest.raises(ValueError, match="expected auto, python or compiled"):
        chunkpath.parser_class()
    monkeypatch.setattr(chunkpath, "_COMPILED", None)
    monkeypatch.setattr(chunkpath, "_WHY_NOT", "ImportError: gone")
    monkeypatch.setenv(chunkpath.ENV, "auto")
    assert chunkpath.path() == "python"  # absent: the pure path, automatically
    monkeypatch.setenv(chunkpath.ENV, "compiled")
    with pytest.raises(ValueError, match="not built .ImportError: gone"):
        chunkpath.parser_class()


@needs_compiled
def test_auto_is_compiled_when_built(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(chunkpath.ENV, raising=False)
    assert chunkpath.path() == "compiled"
    assert chunkpath.parser_class()().chunk_path == "compiled"


def test_ci_builds_the_compiled_path() -> None:
    """CI installs from a clean clone with the README's set-up step: the extension must be there
    (elsewhere its absence is allowed: the pure path then runs, and says so)."""
    if os.environ.get("CI", "").lower() not in ("1", "true", "yes"):
        pytest.skip("not CI")
    assert COMPILED, WHY_NOT


def test_bad_chunk_path_is_one_line_and_exit_2(tmp_path: Path) -> None:
    env = {**os.environ, chunkpath.ENV: "fastest"}
    out = subprocess.run(
        [sys.executable, "-m", "chaoslib_infer.load", "--url", "http://127.0.0.1:9",
         "--rate", "1", "--duration-s", "1", "--out", str(tmp_path / "r.jsonl")],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    assert f"{chunkpath.ENV}='fastest': expected auto, python or compiled" in out.stderr
    assert not (tmp_path / "r.jsonl").exists() or not (tmp_path / "r.jsonl").read_text()
