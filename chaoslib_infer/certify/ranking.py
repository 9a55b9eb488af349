"""Rank certified targets on what is significant: confidence intervals, ties, requests needed.

:func:`attach_intervals` gives the scorecard rows measured over records their bootstrap interval
(:mod:`chaoslib_infer.certify.significance`): the steady-state error rate, the worst phase's P99,
the typical phase's P50 and the ramp's peak QPS. :func:`rank_targets` orders the targets by the
ranking order of ``docs/certification.md``, one figure after the other:

- exact figures (usable, tier verdicts, failed tier-1 rows, disaster tolerance, cost per request)
  decide when they differ;
- an interval figure decides only when the two intervals do not overlap; an overlap is a tie on
  that figure and the next one is compared; a figure without an interval (too few records)
  never decides; recovery time (one measurement per phase, no interval) is shown, never ranked on;
- a figure nobody measured ranks below one that was.

Ranks are **transitive** (:func:`rank_targets`): every pair of targets is compared, and a
target's rank is one more than the number of targets shown better than it. Ties between
neighbours no longer chain: with error-rate intervals A [0.9, 1.1], B [1.05, 1.35] and
C [1.3, 1.5] (A's wholly below C's) A and B rank 1, C ranks 2 (A is shown better than C; B is
told apart from neither). A target shares its rank with the targets it cannot be told apart
from, and the summary says on which figures they tie and how many requests per target a
decision on the first of them needs
(:func:`~chaoslib_infer.certify.significance.requests_needed`).

The error rate of a pairwise decision: two 95 % intervals that do not overlap differ at about
the 0.56 % level (equal widths, normal approximation: the difference is at least
``1.96 sqrt(2) = 2.77`` standard errors); over the ``m = k (k - 1) / 2`` pairs of ``k`` targets
that is a family-wise false ranking rate of at most ``m x 0.56 %`` by Bonferroni (1.7 % for 3
targets, 3.3 % for 4), stated in ``docs/certification.md``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from chaoslib_infer.evidence.render import fmt
from chaoslib_infer.load.records import read_records

from .significance import Interval, e2e_values, interval, overlap, requests_needed

__all__ = ["attach_intervals", "compare", "rank_targets"]


def _records(tdir: Path, ph: dict[str, Any]) -> list[dict[str, Any]]:
    """The phase's records in send order (the block bootstrap resamples runs of them)."""
    path = tdir / str(ph.get("records") or "")
    recs = read_records(path) if path.is_file() else []
    return sorted(recs, key=lambda r: float(r.get("sent_at") or 0.0))


def _row(card: dict[str, Any], tier: int, metric: str) -> dict[str, Any] | None:
    return next((r for r in card["tiers"][tier]["rows"] if r["metric"] == metric), None)


def _set(row: dict[str, Any] | None, ci: Interval | None) -> None:
    """``row["ci"]``: the interval, widened to hold the row's own value where that value lies
    just outside (the point P99/P50 are HDR histogram figures, the top of a 3-digit bucket; the
    bootstrap's are observed values): never narrower than the bootstrap's."""
    if row is None:
        return
    v = _value(row)
    if ci is not None and v is not None:
        ci = Interval(min(ci.lo, v), max(ci.hi, v), ci.n, ci.stat)
    row["ci"] = ci.to_json() if ci is not None else None


def _qps_interval(tdir: Path, ramp: dict[str, Any]) -> Interval | None:
    """Peak QPS interval: the ramp's best step, its records (by send time) by Little's law."""
    steps = [s for s in ramp.get("steps") or [] if s.get("start_at") is not None]
    if not steps:
        return None
    best = max(steps, key=lambda s: float(s.get("ok_rps") or 0.0))
    lo, hi = float(best["start_at"]), float(best["end_at"])
    recs = [r for r in _records(tdir, ramp) if lo <= float(r.get("sent_at") or 0.0) < hi]
    done = [r for r in recs if isinstance(r.get("end_at"), int | float)]
    oks = [1.0 if r.get("ok") else 0.0 for r in done]
    durs = [float(r["end_at"]) - float(r["sent_at"]) for r in done]
    return interval(oks, "qps", durations=durs, concurrency=int(best["concurrency"]))


def attach_intervals(card: dict[str, Any], phases: list[dict[str, Any]], tdir: Path) -> None:
    """Give the scorecard rows measured over records their interval (``row["ci"]``, or None).

    Args:
        card: the target's scorecard (:func:`chaoslib_infer.certify.report.score_target`).
        phases: the target's phases (``records``, ``figures``, ``kind``, ``steps``).
        tdir: the target's evidence folder.
    """
    steady = [p for p in phases if p["kind"] == "steady"]
    fails = [0.0 if r.get("ok") else 1.0 for p in steady for r in _records(tdir, p)]
    _set(_row(card, 0, "error rate (steady state)"), interval(fails, "ratio"))
    p99s = [p for p in phases if p["figures"].get("p99_e2e_s") is not None]
    worst = max(p99s, key=lambda p: float(p["figures"]["p99_e2e_s"]), default=None)
    ci = interval(e2e_values(_records(tdir, worst)), "p99") if worst else None
    _set(_row(card, 0, "P99 E2E latency"), ci)
    typical = next((p for p in phases if p["name"] == "soak"), None) or next(
        (p for p in phases if p["name"] == "single"), None
    )
    ci = interval(e2e_values(_records(tdir, typical)), "p50") if typical else None
    _set(_row(card, 1, "P50 E2E latency"), ci)
    ramp = next((p for p in phases if p["name"] == "ramp"), None)
    _set(_row(card, 1, "peak QPS"), _qps_interval(tdir, ramp) if ramp else None)


_Getter = Callable[[dict[str, Any]], Any]


def _usable(t: dict[str, Any]) -> Any:
    return 1 if (t.get("probe") or {}).get("usable") else 0


def _verdict(tier: int, bad: str) -> _Getter:
    return lambda t: 0 if t["scorecard"]["tiers"][tier]["verdict"] == bad else 1


def _failed_rows(t: dict[str, Any]) -> Any:
    return -sum(1 for r in t["scorecard"]["tiers"][0]["rows"] if r["passed"] is False)


def _tier1_pass(t: dict[str, Any]) -> Any:
    return 1 if t["scorecard"]["tiers"][0]["verdict"] == "PASS" else 0


#: The ranking order: (figure, exact getter or None for a scorecard row, tier, row's metric,
#: higher is better). Recovery time is not here: one measurement per phase, no interval.
_ORDER: list[tuple[str, _Getter | None, int, str | None, bool]] = [
    ("usable", _usable, 0, None, True),
    ("tier 1 verdict", _tier1_pass, 0, None, True),
    ("failed tier-1 rows", _failed_rows, 0, None, True),
    ("error rate (steady state)", None, 0, "error rate (steady state)", False),
    ("disaster tolerance", None, 0, "disaster tolerance", True),
    ("P99 E2E latency", None, 0, "P99 E2E latency", False),
    ("tier 2 verdict", _verdict(1, "FAIL"), 1, None, True),
    ("peak QPS", None, 1, "peak QPS", True),
    ("P50 E2E latency", None, 1, "P50 E2E latency", False),
    ("cost per request", None, 1, "cost per request", False),
]


def _value(row: dict[str, Any] | None) -> float | None:
    v = None if row is None else row.get("value")
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _ci(row: dict[str, Any] | None) -> Interval | None:
    c = None if row is None else row.get("ci")
    if not isinstance(c, dict):
        return None
    return Interval(float(c["lo"]), float(c["hi"]), int(c["n"]), str(c["stat"]))


def _shown(v: float | None, ci: Interval | None, unit: str) -> str:
    text = "unmeasured" if v is None else f"{fmt(v)} {unit}".strip()
    if ci is not None:
        text += f" [{fmt(ci.lo)}, {fmt(ci.hi)}]"
    return text


def compare(a: dict[str, Any], b: dict[str, Any]) -> tuple[int, str, list[str]]:
    """Which of two targets ranks first (module docstring).

    Args:
        a, b: targets (``scorecard``, ``probe``, ``name``), rows with ``ci`` where
            :func:`attach_intervals` gave one.

    Returns:
        ``(order, decided_by, ties)``: ``order`` -1 (``a`` first), 1 (``b`` first) or 0 (no
        figure tells them apart); ``decided_by`` names the deciding figure (with both values
        and intervals), "" on a tie; ``ties`` one line per interval figure whose intervals
        overlapped before the decision (the first with different values says how many
        requests per target a decision on it needs).
    """
    ties: list[str] = []
    for name, getter, tier, metric, higher in _ORDER:
        if getter is not None:
            va, vb = getter(a), getter(b)
            if va != vb:
                return (-1 if va > vb else 1), name, ties
            continue
        assert metric is not None
        ra, rb = _row(a["scorecard"], tier, metric), _row(b["scorecard"], tier, metric)
        va, vb = _value(ra), _value(rb)
        if va is None or vb is None:
            if (va is None) != (vb is None):  # a figure nobody measured ranks below
                return (1 if va is None else -1), f"{name} (unmeasured on one)", ties
            continue
        unit = str((ra or {}).get("unit") or "")
        unit = "" if unit == "ratio" else unit
        if metric == "disaster tolerance" or metric == "cost per request":  # exact figures
            if va != vb:
                first = (va > vb) == higher
                return (-1 if first else 1), f"{name} {fmt(va)} vs {fmt(vb)} {unit}".strip(), ties
            continue
        ca, cb = _ci(ra), _ci(rb)
        if ca is None or cb is None:
            continue  # no interval: the figure cannot decide
        shown = f"{_shown(va, ca, unit)} vs {_shown(vb, cb, unit)}"
        if overlap(ca, cb):
            if va == vb:
                continue  # equal figures: nothing to tell apart, no tie to report
            need = requests_needed(va, ca, vb, cb)
            line = f"tie on {name}: {shown} (95 % intervals overlap)"
            if need is not None and not any("needs about" in t for t in ties):
                line += (
                    f"; a decision on it needs about {need} requests per target (from the "
                    f"observed spread; this run had {ca.n} and {cb.n})"
                )
            ties.append(line)
            continue
        first = (va > vb) == higher
        return (-1 if first else 1), f"{name} {shown}", ties
    return 0, "", ties


def rank_targets(targets: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Order ``targets`` and give each ``rank``, ``tie`` (shares its rank with a target it
    cannot be told apart from), ``tied_with`` (those targets' names), ``better_than`` (the
    names of the targets it is shown better than) and ``ranking_note`` (why it stands above
    each of those, and the tie's lines).

    Every pair is compared (:func:`compare`); a target's rank is one more than the number of
    targets shown better than it (module docstring: transitive, no chain of ties). The order is
    by rank, then by the number of targets each is shown better than (more first), then the
    input order.

    Returns:
        The targets, ranked (the same dicts, updated).
    """
    n = len(targets)
    order = [[0] * n for _ in range(n)]
    why: dict[tuple[int, int], str] = {}
    ties: dict[tuple[int, int], list[str]] = {}
    for i in range(n):
        for j in range(n):
            if i != j:  # both ways: each note reads from its own target's side
                order[i][j], why[(i, j)], ties[(i, j)] = compare(targets[i], targets[j])
    beaten_by = [sum(1 for j in range(n) if order[j][i] == -1) for i in range(n)]
    beats = [sum(1 for j in range(n) if order[i][j] == -1) for i in range(n)]
    for i, t in enumerate(targets):
        t.update(rank=1 + beaten_by[i], tie=False, tied_with=[], better_than=[], ranking_note=[])
    ranked_idx = sorted(range(n), key=lambda i: (beaten_by[i], -beats[i], i))
    for i in ranked_idx:
        t = targets[i]
        for j in ranked_idx:
            if j == i:
                continue
            other = targets[j]
            if order[i][j] == -1:
                t["better_than"].append(other["name"])
                lines = ties[(i, j)]
                note = f"above {other['name']} on {why[(i, j)]}"
                t["ranking_note"].append(note + (f" ({'; '.join(lines)})" if lines else ""))
            elif order[i][j] == 0 and t["rank"] == other["rank"]:
                t["tie"] = True
                t["tied_with"].append(other["name"])
                if ranked_idx.index(i) < ranked_idx.index(j):
                    t["ranking_note"].append(
                        f"ties with {other['name']}: "
                        + ("; ".join(ties[(i, j)]) or "every ranked figure equal")
                    )
            elif order[i][j] == 0:  # cannot be told apart, yet ranked apart by a third target
                t["ranking_note"].append(
                    f"not told apart from {other['name']} (rank {other['rank']}): "
                    + ("; ".join(ties[(i, j)]) or "every ranked figure equal")
                    + "; the ranks differ by the targets each is shown better or worse than"
                )
    return [targets[i] for i in ranked_idx]
