"""The interruption row named for every episode out of SLO (``docs/definitions.md``, "Drill
figures": interruption time; :mod:`chaoslib_infer.measure.episodes`).

``interruption_s`` is the time out of SLO summed over every episode from the injection to the end
of the load; its label says how many episodes there were, when each was (seconds after the
injection) and the longest, so a failed row's reason names a second collapse as such:
``"interruption (time out of SLO): 2 episodes (+0.1 s, +6.3 to +31.2 s after the injection),
longest 24.9 s: 24.9 s > 10 s (interruption_s)"`` (an episode of one failure: its time alone).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from chaoslib_infer.measure.figures import interruption

from .facts import DrillFacts, num

__all__ = ["EPISODES_LABEL", "episode_figures", "name_episode_row"]

#: The interruption row's label: what its value is.
EPISODES_LABEL = "interruption (time out of SLO)"
#: Episodes listed by their span in the label; beyond, only their count and the longest.
LISTED = 4


def episode_figures(facts: DrillFacts, fault_at: float | None) -> dict[str, Any] | None:
    """The episode figures of one drill: the drill's own (``episodes``, ``longest_episode_s``,
    ``episode_spans``, from :func:`chaoslib_infer.drills.interruption.interruption_figures`),
    else, for a drill without an interruption figure of its own (a cluster, network-jitter),
    :func:`chaoslib_infer.measure.figures.interruption` over its records; None for figures
    that carry an interruption without its episodes (evidence written before them)."""
    fig = facts.figures
    if isinstance(fig.get("episode_spans"), list):
        return dict(fig)
    if "interruption_s" in fig or fault_at is None:
        return None
    return interruption(facts.records, fault_at)


def _label(eps: Mapping[str, Any]) -> str | None:
    spans = [s for s in eps.get("episode_spans") or [] if isinstance(s, list | tuple)]
    count = num(eps.get("episodes"))
    if count is None or not spans:
        return None
    n = int(count)
    longest = num(eps.get("longest_episode_s")) or 0.0
    listed = ", ".join(
        f"+{a:.1f} s" if f"{a:.1f}" == f"{b:.1f}" else f"+{a:.1f} to +{b:.1f} s"
        for a, b in spans[:LISTED]
    )
    more = f" and {n - LISTED} more" if n > LISTED else ""
    word = "episode" if n == 1 else "episodes"
    return (
        f"{EPISODES_LABEL}: {n} {word} ({listed}{more} after the injection), "
        f"longest {longest:.3g} s"
    )


def name_episode_row(
    rows: Sequence[dict[str, Any]], facts: DrillFacts, fault_at: float | None
) -> list[dict[str, Any]]:
    """``rows`` with the ``interruption_s`` row labelled with its episodes (module docstring);
    the label as it was when there was no failure after the injection or the figures do not
    carry the episodes. Rows are copied, never changed in place."""
    out = [dict(r) for r in rows]
    if not any(r.get("criterion") == "interruption_s" for r in out):
        return out
    eps = episode_figures(facts, fault_at)
    label = _label(eps) if eps is not None else None
    for row in out:
        if row.get("criterion") == "interruption_s" and label is not None:
            row["label"] = label
    return out
