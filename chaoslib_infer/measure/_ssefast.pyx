# cython: language_level=3, boundscheck=False, wraparound=False
"""The compiled chunk path of the SSE parser (issue 24): ``FastStreamParser``.

A subclass of :class:`chaoslib_infer.measure.sse.StreamParser` (the pure-Python reference, whose
docstring holds the definitions) whose ``feed`` takes a fast path for the common read: the
decoder holds nothing (no partial line, no pending ``data:`` lines, no partial UTF-8 character,
no ``event:`` name), the block is strict UTF-8 without U+FFFD, has no ``\\r``, ends with ``\\n``
and holds only ``data: `` lines and blank lines. Such a block is split and its events interpreted
here, in C, with the state changes the pure path makes (``bytes_in``, ``head``, ``events``,
``done``, ``finish_reason``, ``usage_tokens``, ``usage_prompt_tokens``, ``output_chunks``,
``text_len``, ``error``, ``garbled``). Any other block goes to the pure ``StreamParser.feed``, whole: nothing was changed
before that choice, so both paths give the same state on the same bytes (tests/test_chunk_path.py:
a differential test over recorded streams and a hypothesis fuzz test over split points, malformed
chunks and multi-byte characters cut across reads).

Built by ``setup.py`` (Cython) at ``pip install -e .``; ``chaoslib_infer.measure.chunkpath``
chooses it when it imports.
"""

import json

try:  # as measure.sse: orjson when there, else the standard library
    from orjson import loads as _orjson_loads
except ImportError:  # pragma: no cover - orjson is a dependency
    _orjson_loads = json.loads

from chaoslib_infer.measure.sse import (
    _ERROR_FINISH,
    _HEAD_CHARS,
    MAX_LINE_CHARS,
    StreamParser,
    _error_message,
)
from chaoslib_infer.safety.redact import clip

_BOM = b"\xef\xbb\xbf"
_CONTENT_KEYS = ("content", "reasoning_content", "reasoning")


cdef inline bint _is_str(object v):
    return isinstance(v, str)


cdef int _text(object sp, str val) except -1:
    sp.text_len += len(val)
    if sp.garbled is None and "\ufffd" in val:
        sp.garbled = "U+FFFD in generated text"
    return 0


cdef int _event(object sp, str data) except -1:
    """``StreamParser._event`` for a ``message`` event (same checks, same order)."""
    cdef bint bearing = False
    cdef dict d, c, dl
    sp.events += 1
    stripped = data.strip()
    if stripped == "[DONE]":
        sp.done = True
        return 0
    if not stripped:
        return 0
    try:
        obj = _orjson_loads(stripped)
    except Exception:  # orjson is stricter (NaN, ints over 64 bits, lone surrogates)
        try:
            obj = json.loads(stripped)
        except Exception:
            if sp.garbled is None:
                sp.garbled = f"invalid JSON in stream event: {clip(stripped, 80)!r}"
            return 0
    if not isinstance(obj, dict):
        if sp.garbled is None:
            sp.garbled = f"stream event is not a JSON object: {clip(stripped, 80)!r}"
        return 0
    d = <dict>obj
    err = d.get("error")
    if err or d.get("object") == "error":
        if sp.error is None:
            sp.error = _error_message(err if err else obj)
        return 0
    usage = d.get("usage")
    if isinstance(usage, dict):
        ct = (<dict>usage).get("completion_tokens")
        if isinstance(ct, int) and not isinstance(ct, bool) and ct >= 0:
            sp.usage_tokens = ct
        pt = (<dict>usage).get("prompt_tokens")
        if isinstance(pt, int) and not isinstance(pt, bool) and pt >= 0:
            sp.usage_prompt_tokens = pt
    choices = d.get("choices")
    if not isinstance(choices, list):
        return 0
    for choice in <list>choices:
        if not isinstance(choice, dict):
            continue
        c = <dict>choice
        fr = c.get("finish_reason")
        if _is_str(fr) and fr:
            sp.finish_reason = fr
            if fr in _ERROR_FINISH and sp.error is None:
                sp.error = f"finish_reason={fr}"
        delta = c.get("delta")
        if isinstance(delta, dict):
            dl = <dict>delta
            for key in _CONTENT_KEYS:
                val = dl.get(key)
                if _is_str(val) and val:
                    bearing = True
                    _text(sp, <str>val)
            tcs = dl.get("tool_calls")
            if isinstance(tcs, list) and tcs:
                bearing = True
                for tc in <list>tcs:
                    fn = (<dict>tc).get("function") if isinstance(tc, dict) else None
                    args = (<dict>fn).get("arguments") if isinstance(fn, dict) else None
                    if _is_str(args):
                        _text(sp, <str>args)
        else:
            val = c.get("text")
            if _is_str(val) and val:
                bearing = True
                _text(sp, <str>val)
    if bearing:
        sp.output_chunks += 1
        return 1
    return 0


cdef list _split_events(bytes data, object sse):
    """The events' data of a fast-path block, or None when the block is not one (nothing
    changed)."""
    cdef Py_ssize_t n = len(data)
    if n == 0 or data[n - 1] != 10 or b"\r" in data:
        return None
    if not sse._started and data.startswith(_BOM):
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if "\ufffd" in text:
        return None
    lines = text.split("\n")
    lines.pop()  # "": the block ends with a line end
    events = []
    pending = []
    for line in lines:
        if not line:
            if pending:
                events.append("\n".join(pending) if len(pending) > 1 else pending[0])
                pending = []
        elif line.startswith("data: ") and len(line) <= MAX_LINE_CHARS:
            pending.append(line[6:])
        else:
            return None
    events.append(pending)  # the last item: data lines still waiting for their blank line
    events.append(text)
    return events


class FastStreamParser(StreamParser):
    """:class:`StreamParser` with the compiled chunk path (module docstring); same attributes,
    same results on the same bytes. ``chunk_path`` is ``"compiled"`` (the record's field)."""

    __slots__ = ()
    chunk_path = "compiled"

    def feed(self, data: bytes) -> int:
        """Parse one block of body bytes; returns the number of output-bearing chunks it
        completed (``StreamParser.feed``)."""
        sse = self.sse
        if (
            type(data) is bytes
            and not sse._closed
            and not sse._buf
            and not sse._data
            and not sse._event
            and not sse._dec.getstate()[0]
        ):
            got = _split_events(data, sse)
            if got is not None:
                return self._apply(got, len(data))
        return StreamParser.feed(self, data)

    def _apply(self, got: list, nbytes: int) -> int:
        cdef int n = 0
        sse = self.sse
        text = got.pop()
        pending = got.pop()
        sse.bytes_in += nbytes
        sse._started = True
        have = len(sse.head)
        if have < _HEAD_CHARS:
            sse.head += text[: _HEAD_CHARS - have]
        if pending:
            sse._data = pending
        # the last dispatched event clears the event name: it was already empty
        try:
            for data in got:
                if self.done:
                    continue  # anything after [DONE] is ignored
                n += _event(self, data)
        except Exception as exc:  # defensive, as StreamParser.feed: never raise on input
            if self.garbled is None:
                self.garbled = f"parser error: {type(exc).__name__}"
            return 0
        return n
