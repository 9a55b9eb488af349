"""The prompt's size in tokens, as each record carries it (``prompt_tokens``, ``prompt_tokens_source``).

The engine's own count is best: ``usage.prompt_tokens`` of the reply, when the server sends a
usage object (``stream_options.include_usage``; source ``"usage"``). A request that got no usage
(it failed, the replica crashed on it, the provider sends none) carries our own estimate from the
request body (source ``"estimate"``): 4 characters per token (OpenAI's rule of thumb for English
text, the sim engine's own rule, ``chaoslib_infer/lab/engine/tokens.py``), at least 1, over the
concatenated message contents (chat) or the prompt string (completions); a prompt given as token
ids counts one per id. We have no tokenizer: for a real engine the estimate is approximate,
which its source says.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

__all__ = ["CHARS_PER_TOKEN", "estimate_prompt_tokens", "prompt_fields"]

#: characters per token of the estimate (OpenAI's rule of thumb; the sim engine's count)
CHARS_PER_TOKEN = 4


def _text(content: Any) -> str:
    """A message's text: a string, or the ``text`` of its content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text") or "") for p in content if isinstance(p, Mapping))
    return ""


def estimate_prompt_tokens(body: bytes | str | Mapping[str, Any] | None) -> int | None:
    """Our estimate of a request body's prompt tokens (module docstring).

    Args:
        body: the JSON body (bytes, text or the parsed object).

    Returns:
        The estimate, or None when the body holds no prompt we can read (not JSON, no
        ``messages`` or ``prompt``).
    """
    if body is None:
        return None
    if isinstance(body, bytes | str):
        try:
            body = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            return None
    if not isinstance(body, Mapping):
        return None
    messages, prompt = body.get("messages"), body.get("prompt")
    if isinstance(messages, list):
        text = "".join(_text(m.get("content")) for m in messages if isinstance(m, Mapping))
    elif isinstance(prompt, str):
        text = prompt
    elif isinstance(prompt, list) and prompt and all(isinstance(x, int) for x in prompt):
        return len(prompt)
    elif isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        text = prompt[0]
    else:
        return None
    return max(1, math.ceil(len(text) / CHARS_PER_TOKEN))


def prompt_fields(
    usage_prompt_tokens: int | None, body: bytes | str | Mapping[str, Any] | None
) -> dict[str, Any]:
    """The record's ``{"prompt_tokens", "prompt_tokens_source"}``: the engine's count when its
    usage said so (``"usage"``), else our estimate (``"estimate"``), else both None."""
    if usage_prompt_tokens is not None:
        return {"prompt_tokens": usage_prompt_tokens, "prompt_tokens_source": "usage"}
    est = estimate_prompt_tokens(body)
    return {
        "prompt_tokens": est,
        "prompt_tokens_source": None if est is None else "estimate",
    }
