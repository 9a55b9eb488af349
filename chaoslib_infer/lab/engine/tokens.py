"""The engine's token model: prompt-token counting and deterministic output tokens."""

from __future__ import annotations

import hashlib
import math
import random

_CHARS_PER_TOKEN = 4

# Output vocabulary: English words (1-byte UTF-8), CJK (3-byte), accented Latin (2-byte) and an
# emoji (4-byte), so clients that split characters across network reads get exercised.
_WORDS: tuple[str, ...] = (
    " the", " model", " token", " cache", " drill", " chaos", " latency", " replica", " stream",
    " batch", " queue", " memory", " kernel", " signal", " request", " server", " fleet",
    " recovery", " warm", " load", " prefill", " decode", " a", " of", " and", " to", " is",
    " café", " naïve", ",", ".",
)  # fmt: skip
_CJK: tuple[str, ...] = (
    "中", "文", "模", "型", "推", "理", "缓", "存", "延", "迟", "你好", "世界", "服务", "请求",
)  # fmt: skip
_EMOJI: tuple[str, ...] = ("🙂", "🚀")


def count_text_tokens(text: str) -> int:
    """Approximate a text's token count as ``ceil(len(text) / 4)`` (at least 1).

    Args:
        text: the text.

    Returns:
        Approximate number of tokens (>= 1).
    """
    return max(1, math.ceil(len(text) / _CHARS_PER_TOKEN))


def generate_tokens(request_id: str, n: int) -> list[str]:
    """Deterministic output tokens for a request, one token per stream chunk.

    Every token at index ``k % 4 == 1`` is CJK, so any output of two or more tokens contains a
    CJK character; others mix English words, accented Latin and emoji. No token is empty, and
    tokens are whole characters (never a split code point).

    Args:
        request_id: seeds the generator (same id, same text).
        n: number of tokens.

    Returns:
        ``n`` non-empty strings.
    """
    seed = int.from_bytes(hashlib.blake2b(request_id.encode(), digest_size=8).digest(), "big")
    rng = random.Random(seed)
    out: list[str] = []
    for k in range(n):
        if k % 4 == 1:
            out.append(rng.choice(_CJK))
        elif rng.random() < 0.03:
            out.append(rng.choice(_EMOJI))
        else:
            out.append(rng.choice(_WORDS))
    return out


# --------------------------------------------------------------------------------------------
