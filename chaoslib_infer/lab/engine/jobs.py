"""Completion request bodies (chat and text) validated into :class:`Job`."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from chaoslib_infer.lab.engine.config import EngineConfig
from chaoslib_infer.lab.engine.tokens import count_text_tokens
from chaoslib_infer.lab.engine.wire import RequestError


@dataclass
class Job:
    """One parsed completion request."""

    request_id: str
    chat: bool
    stream: bool
    include_usage: bool
    prompt_tokens: int
    max_tokens: int
    finish_reason: str
    arrival: float  # perf_counter seconds
    created: int = field(default_factory=lambda: int(time.time()))


def _content_text(content: Any) -> str:
    """Text of a chat message ``content`` (string, or list of parts with ``text``)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, str):
                parts.append(part)
        return "".join(parts)
    raise RequestError(400, "message content must be a string or a list of content parts")


def parse_job(body: Any, chat: bool, request_id: str, config: EngineConfig) -> Job:
    """Validate a completion request body into a job.

    Raises:
        RequestError: 400 on any invalid field.
    """
    if not isinstance(body, dict):
        raise RequestError(400, "request body must be a JSON object")
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RequestError(400, "'messages' is required and must be a non-empty list")
        texts = []
        for msg in messages:
            if not isinstance(msg, dict) or "role" not in msg:
                raise RequestError(400, "each message must be an object with a 'role'")
            texts.append(_content_text(msg.get("content")))
        prompt_tokens = count_text_tokens("".join(texts))
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            prompt_tokens = count_text_tokens(prompt)
        elif isinstance(prompt, list) and prompt and all(isinstance(x, int) for x in prompt):
            prompt_tokens = len(prompt)
        elif isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt_tokens = count_text_tokens(prompt[0])
        else:
            raise RequestError(
                400, "'prompt' is required: a string, a one-element string list or token ids"
            )
    max_tokens: Any = body.get("max_completion_tokens")
    if max_tokens is None:
        max_tokens = body.get("max_tokens")
    if max_tokens is None:
        n, finish = config.output_tokens, "stop"  # natural end of generation
    elif isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens >= 1:
        n, finish = max_tokens, "length"
    else:
        raise RequestError(400, "max_tokens must be an integer >= 1")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError(400, "'stream' must be a boolean")
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise RequestError(400, "'stream_options' must be an object")
    if opts and not stream:
        raise RequestError(400, "Stream options can only be defined when `stream=True`.")
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise RequestError(400, "'ignore_eos' must be a boolean")
    return Job(
        request_id=request_id,
        chat=chat,
        stream=stream,
        include_usage=bool(opts.get("include_usage", False)),
        prompt_tokens=prompt_tokens,
        max_tokens=n,
        finish_reason=finish,
        arrival=time.perf_counter(),
    )
