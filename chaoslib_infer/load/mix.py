"""Prompt-length mixtures: each request draws a prompt class by weight.

Realistic traffic has random prompt lengths and about 5 % very long requests
(``docs/definitions.md``); fixed prompts hide long-context instability. A mixture is written
``CLASS:WEIGHT,...`` where a class is either

* a named class of :data:`MIX_CLASSES` (``short``, ``mid``, ``long``): it sets the prompt words
  *and* ``max_tokens`` (the same classes as ``chaos-infer load soak --mix``), or
* a number of prompt words (``64:80,2048:20``): it sets the prompt words only; ``max_tokens``
  stays the load's own.

Weights are relative (``short:70,long:5`` draws ``long`` 5 times in 75). Used by
:class:`chaoslib_infer.load.client.LoadSpec` (``prompt_mix``), ``python -m chaoslib_infer.load
--prompt-mix`` and the background-load control's ``prompt_mix`` argument.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "MAX_PROMPT_WORDS",
    "PROMPT_WORDS",
    "MIX_CLASSES",
    "PromptClass",
    "draw",
    "format_mix",
    "parse_prompt_mix",
]

#: Named prompt-length classes: (prompt words, max_tokens). "long" is the ~5% very long prompt.
MIX_CLASSES: dict[str, tuple[int, int]] = {
    "short": (16, 32),
    "mid": (256, 128),
    "long": (2048, 256),
}
#: Largest word count a numeric class may ask for (a prompt of ~100k tokens).
#: The words synthetic prompts are drawn from (the built-in client's and the trace replay's).
PROMPT_WORDS: tuple[str, ...] = tuple(
    (
        "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november "
        "oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu river stone "
        "cloud paper engine garden window silver orange market planet signal bridge candle forest"
    ).split()
)
MAX_PROMPT_WORDS = 65536


@dataclass(frozen=True)
class PromptClass:
    """One class of a mixture.

    Attributes:
        name: the class as written (``"long"`` or ``"64"``).
        prompt_words: words after the nonce in the prompt.
        max_tokens: ``max_tokens`` of its requests, or None to keep the load's own.
        weight: relative weight (> 0).
    """

    name: str
    prompt_words: int
    max_tokens: int | None
    weight: float


def _one(name: Any, weight: Any) -> PromptClass:
    label = str(name).strip()
    if isinstance(weight, bool):
        weight = None
    try:
        w = float(weight)
    except (TypeError, ValueError):
        raise ValueError(f"prompt mix: bad weight {weight!r} for class {label!r}") from None
    if not (w > 0 and math.isfinite(w)):
        raise ValueError(f"prompt mix: weight of {label!r} must be a number > 0, got {weight!r}")
    if label in MIX_CLASSES:
        words, max_tokens = MIX_CLASSES[label]
        return PromptClass(label, words, max_tokens, w)
    if label.isdigit() and 0 <= int(label) <= MAX_PROMPT_WORDS:
        return PromptClass(label, int(label), None, w)
    raise ValueError(
        f"prompt mix: unknown class {label!r} (a word count 0..{MAX_PROMPT_WORDS} or one of "
        f"{', '.join(MIX_CLASSES)})"
    )


def parse_prompt_mix(value: Any) -> tuple[PromptClass, ...]:
    """Parse and validate a prompt mixture.

    Args:
        value: ``"short:70,mid:25,long:5"`` / ``"64:80,2048:20"`` (see the module docstring), a
            mapping ``{class: weight}``, a sequence of ``[class, weight]`` pairs, or an already
            parsed tuple of :class:`PromptClass` (validated again).

    Returns:
        The classes in the order given (a class named twice is an error).

    Raises:
        ValueError: empty, malformed, an unknown class, a weight that is not > 0 (one line).
    """
    pairs: list[tuple[Any, Any]] = []
    if isinstance(value, str):
        for part in value.split(","):
            if not part.strip():
                continue
            name, sep, weight = part.strip().rpartition(":")
            if not sep:
                raise ValueError(f"prompt mix: expected CLASS:WEIGHT, got {part.strip()!r}")
            pairs.append((name, weight))
    elif isinstance(value, Mapping):
        pairs = list(value.items())
    elif isinstance(value, Sequence):
        for item in value:
            if isinstance(item, PromptClass):
                pairs.append((item.name, item.weight))
            elif isinstance(item, Sequence) and not isinstance(item, str) and len(item) == 2:
                pairs.append((item[0], item[1]))
            else:
                raise ValueError(f"prompt mix: expected [class, weight] pairs, got {item!r}")
    else:
        raise ValueError(
            f"prompt mix must be 'CLASS:WEIGHT,...' or a mapping of class to weight, got {value!r}"
        )
    if not pairs:
        raise ValueError("prompt mix is empty; e.g. short:70,mid:25,long:5")
    out = tuple(_one(n, w) for n, w in pairs)
    names = [c.name for c in out]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise ValueError(f"prompt mix: class {dup!r} given twice")
    return out


def format_mix(mix: Sequence[PromptClass]) -> str:
    """The ``CLASS:WEIGHT,...`` text of a parsed mixture (what ``--prompt-mix`` takes)."""

    def weight(w: float) -> str:
        short = f"{w:g}"
        return short if float(short) == w else repr(w)

    return ",".join(f"{c.name}:{weight(c.weight)}" for c in mix)


def draw(mix: Sequence[PromptClass], rng: random.Random) -> PromptClass:
    """One class drawn by weight with ``rng``."""
    if len(mix) == 1:
        return mix[0]
    return rng.choices(list(mix), weights=[c.weight for c in mix])[0]
