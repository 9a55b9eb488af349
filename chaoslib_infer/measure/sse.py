"""Incremental parser for OpenAI-compatible streaming (SSE) responses.

Two layers:

* ``SSEDecoder`` turns arbitrary byte blocks into Server-Sent Events (WHATWG HTML "server-sent
  events" parsing rules: ``\\r\\n``, ``\\r`` or ``\\n`` line ends, ``data:`` lines joined with
  ``\\n``, a blank line dispatches, ``:`` comments ignored). UTF-8 is decoded with an incremental
  decoder, so a character split across reads is reassembled; invalid bytes become U+FFFD and are
  flagged.
* ``StreamParser`` interprets the events as an OpenAI ``/v1/chat/completions`` or
  ``/v1/completions`` stream: counts output-bearing chunks, records ``finish_reason``, ``usage``,
  ``[DONE]``, error objects, and classifies the whole reply (``classify``).

Classification (``docs/definitions.md``, "Denominators"), first match wins:

1. ``stream_error``: an error object inside the stream (``{"error": ...}``, ``{"object": "error"}``,
   an ``event: error`` event, or ``finish_reason`` ``"error"``/``"abort"``), or a non-SSE body that is
   a JSON error object.
2. ``garbled``: invalid UTF-8, a U+FFFD character, an event whose data is not a JSON object, a
   non-SSE body, or a line longer than ``MAX_LINE_CHARS``.
3. ``empty``: no output-bearing chunk at all.
4. ``truncated``: no ``finish_reason`` or no ``[DONE]``.

Nothing in this module raises on any input bytes (it is fuzzed).
"""

from __future__ import annotations

import codecs
import json
import re
from dataclasses import dataclass
from typing import Any

from chaoslib_infer.safety.redact import clip

try:  # several times faster than json.loads on stream chunks (the client's hot path)
    from orjson import loads as _fast_loads
except ImportError:  # pragma: no cover - orjson is a dependency
    _fast_loads = json.loads  # type: ignore[assignment]

__all__ = ["MAX_LINE_CHARS", "SSEDecoder", "SSEEvent", "StreamParser"]

#: A single SSE line longer than this (characters) is dropped and marks the stream garbled.
MAX_LINE_CHARS = 1 << 20
_HEAD_CHARS = 4096
_LINE_SPLIT = re.compile(r"\r\n|\r|\n")
_ERROR_FINISH = frozenset({"error", "abort"})


@dataclass(slots=True)
class SSEEvent:
    """One dispatched server-sent event.

    Attributes:
        data: the ``data:`` lines joined with ``\\n``.
        event: the ``event:`` name (``"message"`` when absent).
        id: the last ``id:`` seen, or None.
    """

    data: str
    event: str = "message"
    id: str | None = None


class SSEDecoder:
    """Incremental bytes -> ``SSEEvent`` decoder; never raises on input.

    Attributes:
        saw_replacement: a U+FFFD appeared in the decoded text (invalid UTF-8, or sent literally).
        overlong: a line exceeded ``MAX_LINE_CHARS`` and was dropped.
        unknown_lines: count of lines with a field name other than data/event/id/retry.
        head: the first ``_HEAD_CHARS`` characters of the decoded body (for non-SSE bodies).
        partial_tail: at ``close``, a line without a terminator was pending (the body was cut).
        bytes_in: bytes fed so far.
    """

    __slots__ = (
        "_dec",
        "_buf",
        "_data",
        "_event",
        "_id",
        "_started",
        "_closed",
        "saw_replacement",
        "overlong",
        "unknown_lines",
        "head",
        "partial_tail",
        "bytes_in",
    )

    def __init__(self) -> None:
        self._dec = codecs.getincrementaldecoder("utf-8")("replace")
        self._buf = ""
        self._data: list[str] = []
        self._event = ""
        self._id: str | None = None
        self._started = False
        self._closed = False
        self.saw_replacement = False
        self.overlong = False
        self.unknown_lines = 0
        self.head = ""
        self.partial_tail = False
        self.bytes_in = 0

    def feed(self, data: bytes) -> list[SSEEvent]:
        """Decode one block of bytes (any split) and return the events it completed."""
        if self._closed or not data:
            return []
        self.bytes_in += len(data)
        return self._feed_text(self._dec.decode(data))

    def close(self) -> list[SSEEvent]:
        """Flush at end of body: return events completed by a final unterminated line.

        Per the SSE rules an event not followed by a blank line is still dispatched here when its
        lines were complete (lenient towards servers that omit the last blank line); a final line
        without any terminator sets ``partial_tail`` and is dropped. Idempotent.
        """
        if self._closed:
            return []
        events = self._feed_text(self._dec.decode(b"", final=True))
        self._closed = True
        buf = self._buf
        self._buf = ""
        if buf.endswith("\r"):
            self._line(buf[:-1], events)
        elif buf:
            self.partial_tail = True
        if self._data:
            events.append(SSEEvent("\n".join(self._data), self._event or "message", self._id))
            self._data = []
        return events

    def _feed_text(self, text: str) -> list[SSEEvent]:
        if not text:
            return []
        if not self._started:
            self._started = True
            if text.startswith("\ufeff"):
                text = text[1:]
        if "\ufffd" in text:
            self.saw_replacement = True
        if len(self.head) < _HEAD_CHARS:
            self.head += text[: _HEAD_CHARS - len(self.head)]
        buf = self._buf + text if self._buf else text
        hold_cr = buf.endswith("\r")
        if hold_cr:
            buf = buf[:-1]
        lines = _LINE_SPLIT.split(buf) if "\r" in buf else buf.split("\n")
        rest = lines.pop()
        if hold_cr:
            rest += "\r"
        if len(rest) > MAX_LINE_CHARS:
            self.overlong = True
            rest = ""
        self._buf = rest
        events: list[SSEEvent] = []
        data = self._data
        for line in lines:
            if line[:6] == "data: " and len(line) <= MAX_LINE_CHARS:
                data.append(line[6:])  # the common line, as ``_line`` would take it
            else:
                self._line(line, events)
                data = self._data  # a dispatch starts a new list
        return events

    def _line(self, line: str, events: list[SSEEvent]) -> None:
        if not line:
            if self._data:
                events.append(SSEEvent("\n".join(self._data), self._event or "message", self._id))
                self._data = []
            self._event = ""
            return
        if line[0] == ":":
            return
        if len(line) > MAX_LINE_CHARS:
            self.overlong = True
            return
        idx = line.find(":")
        if idx < 0:
            field, value = line, ""
        else:
            field = line[:idx]
            value = line[idx + 1 :]
            if value[:1] == " ":
                value = value[1:]
        if field == "data":
            self._data.append(value)
        elif field == "event":
            self._event = value
        elif field == "id":
            if "\0" not in value:
                self._id = value
        elif field == "retry":
            pass
        else:
            self.unknown_lines += 1


def _looks_sse(head: str) -> bool:
    """True when the body is empty/blank or its first non-blank line is an SSE field or comment."""
    for line in _LINE_SPLIT.split(head):
        if line.strip():
            return line.startswith((":", "data", "event", "id", "retry"))
    return True


def _error_message(err: Any) -> str:
    if isinstance(err, dict):
        msg = err.get("message")
        if isinstance(msg, str) and msg:
            return clip(msg, 300)
    try:
        return clip(json.dumps(err, ensure_ascii=False), 300)
    except Exception:  # pragma: no cover - json.dumps of parsed JSON does not fail
        return clip(repr(err), 300)


class StreamParser:
    """Interpret an OpenAI-compatible SSE stream, incrementally.

    Feed every body block with ``feed`` (it returns how many output-bearing chunks the block
    completed, so the caller can timestamp them), then call ``close`` and ``classify``.

    An output-bearing chunk is an event with at least one choice carrying non-empty
    ``delta.content``, ``delta.reasoning_content``, ``delta.reasoning``, ``delta.tool_calls`` (chat)
    or ``text`` (completions). The role-only first chunk of a chat stream, a finish-only chunk and a
    usage-only chunk are not output-bearing (``docs/definitions.md``, "Metrics").

    Attributes:
        done: ``data: [DONE]`` was seen.
        finish_reason: the last non-null ``finish_reason`` seen.
        usage_tokens: ``usage.completion_tokens`` when the server sent it, else None.
        usage_prompt_tokens: ``usage.prompt_tokens`` when the server sent it (the prompt as the
            engine counted it), else None.
        output_chunks: number of output-bearing chunks.
        text_len: characters of generated output (content, reasoning, text, tool-call arguments).
        error: message of an in-stream error object, or None.
        garbled: reason the stream is garbled, or None.
        events: number of data events seen.
    """

    __slots__ = (
        "sse",
        "done",
        "finish_reason",
        "usage_tokens",
        "usage_prompt_tokens",
        "output_chunks",
        "text_len",
        "error",
        "garbled",
        "events",
        "_closed",
    )

    #: which chunk path this parser is (the record's ``chunk_path``; ``measure.chunkpath``)
    chunk_path = "python"

    def __init__(self) -> None:
        self.sse = SSEDecoder()
        self.done = False
        self.finish_reason: str | None = None
        self.usage_tokens: int | None = None
        self.usage_prompt_tokens: int | None = None
        self.output_chunks = 0
        self.text_len = 0
        self.error: str | None = None
        self.garbled: str | None = None
        self.events = 0
        self._closed = False

    def feed(self, data: bytes) -> int:
        """Parse one block of body bytes; returns the number of output-bearing chunks it completed."""
        try:
            return self._handle(self.sse.feed(data))
        except Exception as exc:  # defensive: never raise on input
            if self.garbled is None:
                self.garbled = f"parser error: {type(exc).__name__}"
            return 0

    def close(self) -> int:
        """Signal end of body; returns output-bearing chunks completed by the final bytes."""
        if self._closed:
            return 0
        self._closed = True
        try:
            return self._handle(self.sse.close())
        except Exception as exc:  # defensive: never raise on input
            if self.garbled is None:
                self.garbled = f"parser error: {type(exc).__name__}"
            return 0

    def _handle(self, events: list[SSEEvent]) -> int:
        n = 0
        for ev in events:
            if self.done:
                continue  # anything after [DONE] is ignored
            n += self._event(ev)
        return n

    def _event(self, ev: SSEEvent) -> int:
        self.events += 1
        data = ev.data
        if ev.event == "error":
            if self.error is None:
                self.error = clip(data or "error event", 300)
            return 0
        stripped = data.strip()
        if stripped == "[DONE]":
            self.done = True
            return 0
        if not stripped:
            return 0
        try:
            obj = _fast_loads(stripped)
        except Exception:  # orjson is stricter (NaN, ints over 64 bits, lone surrogates)
            try:
                obj = json.loads(stripped)
            except Exception:  # ValueError, RecursionError
                if self.garbled is None:
                    self.garbled = f"invalid JSON in stream event: {clip(stripped, 80)!r}"
                return 0
        if not isinstance(obj, dict):
            if self.garbled is None:
                self.garbled = f"stream event is not a JSON object: {clip(stripped, 80)!r}"
            return 0
        err = obj.get("error")
        if err or obj.get("object") == "error":
            if self.error is None:
                self.error = _error_message(err if err else obj)
            return 0
        usage = obj.get("usage")
        if isinstance(usage, dict):
            ct = usage.get("completion_tokens")
            if isinstance(ct, int) and not isinstance(ct, bool) and ct >= 0:
                self.usage_tokens = ct
            pt = usage.get("prompt_tokens")
            if isinstance(pt, int) and not isinstance(pt, bool) and pt >= 0:
                self.usage_prompt_tokens = pt
        choices = obj.get("choices")
        if not isinstance(choices, list):
            return 0
        bearing = False
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            fr = choice.get("finish_reason")
            if isinstance(fr, str) and fr:
                self.finish_reason = fr
                if fr in _ERROR_FINISH and self.error is None:
                    self.error = f"finish_reason={fr}"
            delta = choice.get("delta")
            if isinstance(delta, dict):
                for key in ("content", "reasoning_content", "reasoning"):
                    val = delta.get(key)
                    if isinstance(val, str) and val:
                        bearing = True
                        self._text(val)
                tcs = delta.get("tool_calls")
                if isinstance(tcs, list) and tcs:
                    bearing = True
                    for tc in tcs:
                        fn = tc.get("function") if isinstance(tc, dict) else None
                        args = fn.get("arguments") if isinstance(fn, dict) else None
                        if isinstance(args, str):
                            self._text(args)
            else:
                val = choice.get("text")
                if isinstance(val, str) and val:
                    bearing = True
                    self._text(val)
        if bearing:
            self.output_chunks += 1
            return 1
        return 0

    def _text(self, val: str) -> None:
        self.text_len += len(val)
        if "\ufffd" in val and self.garbled is None:
            self.garbled = "U+FFFD in generated text"

    def classify(self) -> tuple[str | None, str | None]:
        """Classify the reply after ``close``.

        Returns:
            ``(None, None)`` for a complete, clean reply, else ``(error_class, message)`` with
            ``error_class`` one of ``stream_error``, ``garbled``, ``empty``, ``truncated``.
        """
        sse = self.sse
        if self.error is not None:
            return "stream_error", self.error
        non_sse = self.events == 0 and not _looks_sse(sse.head)
        if non_sse:
            body = sse.head.strip()
            try:
                obj = json.loads(body)
            except Exception:
                obj = None
            if isinstance(obj, dict) and (obj.get("error") or obj.get("object") == "error"):
                return "stream_error", _error_message(obj.get("error") or obj)
        if sse.saw_replacement:
            return "garbled", "invalid UTF-8 (or U+FFFD) in response body"
        if self.garbled is not None:
            return "garbled", self.garbled
        if sse.overlong:
            return "garbled", f"SSE line longer than {MAX_LINE_CHARS} characters"
        if non_sse:
            return "garbled", f"response is not an SSE stream: {clip(sse.head, 80)!r}"
        if self.output_chunks == 0:
            if sse.bytes_in == 0:
                return "empty", "empty response body"
            return "empty", f"no generated output ({self.events} events, done={self.done})"
        if not self.done or self.finish_reason is None:
            missing = []
            if self.finish_reason is None:
                missing.append("finish_reason")
            if not self.done:
                missing.append("[DONE]")
            return "truncated", "stream ended without " + " and ".join(missing)
        return None, None
