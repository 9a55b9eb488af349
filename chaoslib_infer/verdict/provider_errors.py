"""The rows of the provider-error criteria (``drills/criterion.py`` ``provider_errors``) from a
drill's figures (``evidence/figures.py`` ``common_figures``: the engine ledger's ``http_error``
answers, :func:`chaoslib_infer.measure.retryafter.provider_error_figures`).

``n/a`` with :data:`NO_ANSWER` in a drill in which the engine answered no provider error (every
drill but one that arms the ``http_error`` fault); ``retry_after_honoured`` ``n/a`` when no
answer carrying ``Retry-After`` was retried (nothing to honour), never a pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .facts import num

__all__ = ["NO_ANSWER", "NO_RETRY_AFTER", "provider_error_rows"]

#: The rows' note in a drill where the engine answered no provider error.
NO_ANSWER = "no provider error answered in this drill (the http_error engine fault was not armed)"
#: ``retry_after_honoured``'s note when no answer with Retry-After was followed by a retry.
NO_RETRY_AFTER = "no answer carrying Retry-After was retried: nothing to honour"

_NAMES = ("retry_after_honoured", "retried_final", "load_amplification", "gave_up_retryable")


def provider_error_rows(fig: Mapping[str, Any]) -> dict[str, tuple[float | None, str | None]]:
    """``{criterion: (value, note)}`` of the provider-error criteria from ``fig`` (the drill's
    figures: ``provider_error_answers``, ``retry_after_honoured_share``, ``retried_final``,
    ``load_amplification``, ``gave_up_retryable``)."""
    if not num(fig.get("provider_error_answers")):
        return {n: (None, NO_ANSWER) for n in _NAMES}
    share = num(fig.get("retry_after_honoured_share"))
    return {
        "retry_after_honoured": (share, None if share is not None else NO_RETRY_AFTER),
        "retried_final": (num(fig.get("retried_final")), None),
        "load_amplification": (num(fig.get("load_amplification")), None),
        "gave_up_retryable": (num(fig.get("gave_up_retryable")), None),
    }
