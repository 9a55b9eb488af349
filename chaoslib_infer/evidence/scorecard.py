"""The game day's scorecard, in three priority tiers (``docs/definitions.md``).

Tier 1, stability, comes first: error rate, P99 latency, recovery time, disaster tolerance. Tier 2,
performance and cost: QPS, P50 latency, cost per request (only when a price is given). Tier 3, model
quality, is out of scope: this project measures the service, not the model.

Inputs are ``summary.json`` (each drill's ``figures`` and ``hypothesis``) and, where the run folder
is at hand, each drill's ``records.jsonl`` (for achieved QPS and output tokens). References are the
acceptance references (``chaoslib_infer.measure.slo.Thresholds`` defaults): error rate below
0.1%, P99 at most 10 s, P50 within 2 s (chat), recovery "minutes at most" (read here as 5 minutes).

Definitions used:

- **error rate**: failed / attempted requests over all drills together (faults included; each
  retried drill's requests by their final outcome). Judged against the acceptance SLO only when a
  drill was judged by the ``strict`` verdict policy (zero loss); under the ``default`` policy it
  is shown, not judged: faults are injected on purpose, each drill judges what its fault cost the
  error budget, and the error-budget row sums that.
- **P99**: the worst drill's P99 E2E latency over its successful requests (seconds).
- **recovery time**: per drill its ``recovery_s`` (back inside the baseline bands); the worst
  drill. A drill that measured none reads unmeasured, named in the note: never another figure
  (an interruption or a restart time is not a recovery time).
- **error-budget cost**: the sum over the drills of ``budget_share`` (each fault's error-budget
  cost at its expected incidents per month, over the monthly budget of the availability SLO;
  ``docs/definitions.md``, "Drill figures"): what the faults drilled, together, would spend of
  one month's budget. Reference: below 100 % (each drill judges its own share against its
  ``budget_share`` threshold); drills whose cost is unmeasured are named in the note.
- **disaster tolerance**: drills that passed / drills run. A drill that answered nothing
  (inconclusive, error, aborted) is not judged: it lowers the share, its row reads "not judged:
  N", and no tier reads PASS while any drill is not judged (``INCONCLUSIVE`` unless a row
  fails: ``FAIL``), so grey never reads green.
- **QPS**: successful requests per second of load time (first send to last end) of each drill: the
  throughput achieved at the drill's offered load, not the saturation peak.
- **cost per request**: ``price_per_1k_tokens x mean output tokens of successful requests / 1000``,
  or ``price_per_instance_hour x replicas x load hours / successful requests``.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from chaoslib_infer.evidence.detection_view import scorecard_row
from chaoslib_infer.load.records import read_records
from chaoslib_infer.measure.figures import RECOVERY_UNMEASURED

__all__ = [
    "BUDGET_REFERENCE",
    "ERROR_RATE_REFERENCE",
    "JUDGED",
    "P50_REFERENCE_S",
    "P99_REFERENCE_S",
    "RECOVERY_REFERENCE_S",
    "build_scorecard",
    "drill_load_stats",
]

#: Acceptance references (docs/definitions.md, "Acceptance SLOs").
ERROR_RATE_REFERENCE = 0.001
P99_REFERENCE_S = 10.0
P50_REFERENCE_S = 2.0
#: "Recovery time: minutes at most" read as five minutes.
RECOVERY_REFERENCE_S = 300.0
#: How a drill without a recovery time of its own reads (``recovery_figure``).
RECOVERY_UNMEASURED_FIGURE = "recovery_s (unmeasured)"

MODEL_QUALITY_NOTE = (
    "Out of scope: chaoslib-infer measures the inference service (latency, throughput, "
    "stability), not the model. Judge model quality with offline evaluations (e.g. MMLU, "
    "HumanEval, your own task set) on the same model and quantisation."
)


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _ts(value: Any) -> float | None:
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str) and value:
        try:
            return dt.datetime.fromisoformat(value).timestamp()
        except ValueError:
            return None
    return None


def drill_load_stats(drill_dir: Path) -> dict[str, Any] | None:
    """Achieved throughput of one drill from its ``records.jsonl``.

    Returns:
        ``{"ok", "attempts", "load_s", "qps", "mean_output_tokens"}`` (``load_s`` seconds from the
        first send to the last end; ``qps`` successful requests per second of it), or ``None``
        without records.
    """
    path = drill_dir / "records.jsonl"
    if not path.is_file():
        return None
    records = read_records(path)
    if not records:
        return None
    starts = [float(r["sent_at"]) for r in records if r.get("sent_at") is not None]
    ends = [float(r["end_at"]) for r in records if r.get("end_at") is not None]
    ok = [r for r in records if r.get("ok")]
    load_s = (max(ends) - min(starts)) if starts and ends else 0.0
    tokens = [int(r.get("output_tokens") or 0) for r in ok]
    return {
        "ok": len(ok),
        "attempts": len(records),
        "load_s": load_s,
        "qps": (len(ok) / load_s) if load_s > 0 else None,
        "mean_output_tokens": (sum(tokens) / len(tokens)) if tokens else None,
    }


def _row(
    metric: str,
    value: float | None,
    unit: str,
    reference: str,
    passed: bool | None,
    note: str = "",
) -> dict[str, Any]:
    return {
        "metric": metric,
        "value": value,
        "unit": unit,
        "reference": reference,
        "passed": passed,
        "note": note,
    }


inf = float("inf")


def _recovery(figures: dict[str, Any]) -> tuple[float | None, str]:
    """The drill's recovery time: ``(seconds, "recovery_s")`` when the drill measured one;
    ``(inf, "recovery_s")`` when it measured it and never recovered (a failure); ``(None,
    "recovery_s (unmeasured)")`` when its ``recovery_note`` says the load ended first, or
    when the drill measures none: never read off another figure."""
    if "recovery_s" not in figures:
        return None, RECOVERY_UNMEASURED_FIGURE
    value = _num(figures.get("recovery_s"))
    if value is None and str(figures.get("recovery_note") or "").startswith(RECOVERY_UNMEASURED):
        return None, RECOVERY_UNMEASURED_FIGURE
    return (value if value is not None else float("inf")), "recovery_s"


def _policy_name(drill: dict[str, Any]) -> str:
    """The verdict policy a drill was judged by (its ``verdict_policy.name``; ``default`` for
    evidence written before policies existed)."""
    policy = drill.get("verdict_policy")
    name = policy.get("name") if isinstance(policy, dict) else None
    return str(name) if name else "default"


#: Drill states that answered their question (``deviated``: the older name of ``failed``).
JUDGED = ("passed", "failed", "deviated")


def _tier_verdict(rows: list[dict[str, Any]], not_judged: int = 0) -> str:
    """``FAIL`` (a judged row fails), else ``INCONCLUSIVE`` (``not_judged`` drills answered
    nothing: what they did not judge cannot pass), else ``NO DATA`` (nothing judged), else
    ``PASS``."""
    judged = [r["passed"] for r in rows if r["passed"] is not None]
    if not all(judged):
        return "FAIL"
    if not_judged:
        return "INCONCLUSIVE"
    return "PASS" if judged else "NO DATA"


def _not_judged_note(per_drill: list[dict[str, Any]]) -> str:
    """``"not judged: N (inconclusive 2, error 1)"`` for the drills that answered nothing, or
    ``""``."""
    grey = [str(p["status"]) for p in per_drill if p["status"] not in JUDGED]
    if not grey:
        return ""
    counts = ", ".join(f"{s} {grey.count(s)}" for s in sorted(set(grey)))
    return f"not judged: {len(grey)} ({counts})"


def _recovery_row(per_drill: list[dict[str, Any]]) -> dict[str, Any]:
    """The recovery-time row: the worst drill's ``recovery_s``; ``unmeasured`` (value None, not
    judged) when no drill measured one, and the drills that did not named in the note."""
    recs = [p for p in per_drill if p["recovery_s"] is not None or p["never_recovered"]]
    missing = [
        str(p["name"]) for p in per_drill if p["recovery_s"] is None and not p["never_recovered"]
    ]
    reference = f"minutes at most (<= {RECOVERY_REFERENCE_S:g} s)"
    if not recs:
        note = "unmeasured: no drill measured a recovery time (recovery_s)"
        return _row("recovery time", None, "s", reference, None, note)
    worst = max(recs, key=lambda p: inf if p["never_recovered"] else p["recovery_s"])
    note = f"worst drill: {worst['name']} ({worst['recovery_figure']})"
    note += ": never recovered" if worst["never_recovered"] else ""
    if missing:
        note += f"; unmeasured: {', '.join(missing)}"
    passed = not worst["never_recovered"] and worst["recovery_s"] <= RECOVERY_REFERENCE_S
    return _row("recovery time", worst["recovery_s"], "s", reference, passed, note)


#: The faults of one game day together may spend at most this share of a month's error budget.
BUDGET_REFERENCE = 1.0


def _budget_row(per_drill: list[dict[str, Any]]) -> dict[str, Any]:
    """The error-budget row: the drills' ``budget_share`` summed (module docstring), the worst
    drill and the unmeasured ones in its note; not judged when no drill measured it."""
    shares = [p for p in per_drill if p["budget_share"] is not None]
    total = sum(p["budget_share"] for p in shares) if shares else None
    missing = [str(p["name"]) for p in per_drill if p["budget_share"] is None]
    note = "sum over the drills of each fault's share at its expected incidents per month"
    if shares:
        worst = max(shares, key=lambda p: p["budget_share"])
        note += (
            f"; worst drill: {worst['name']} ({worst['budget_cost_s']:.3g} s of full outage, "
            f"{worst['budget_share']:.3%})"
        )
    if missing:
        note += f"; unmeasured: {', '.join(missing)}"
    return _row(
        "error-budget cost",
        total,
        "ratio",
        f"< {BUDGET_REFERENCE:.0%} of the monthly budget",
        (total < BUDGET_REFERENCE) if total is not None else None,
        note,
    )


def build_scorecard(
    summary: dict[str, Any],
    run_dir: Path | None = None,
    pricing: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Score a game day in the three priority tiers.

    Args:
        summary: the ``summary.json`` mapping (``drills[].figures``, ``hypothesis``, ``target``).
        run_dir: the game-day folder; each ``<drill>/records.jsonl`` there gives QPS and tokens.
        pricing: ``{"price_per_1k_tokens": float}`` and/or ``{"price_per_instance_hour": float}``
            plus an optional ``"currency"`` (default ``"USD"``); ``None``: ``summary["pricing"]``.

    Returns:
        ``{"tiers": [{"tier", "name", "verdict", "not_judged", "rows", "drills"}, ...],
        "pricing"}`` (``verdict``: ``PASS``, ``FAIL``, ``INCONCLUSIVE`` (``not_judged`` drills,
        none failing) or ``NO DATA``); rows are
        ``{"metric", "value", "unit", "reference", "passed", "note"}`` (``passed`` ``None`` where
        nothing is judged), ``drills`` per-drill figures. Tier 3 has ``"out_of_scope": True`` and a
        ``note``.
    """
    drills = [d for d in summary.get("drills") or [] if isinstance(d, dict)]
    pricing = pricing if pricing is not None else summary.get("pricing")
    pricing = {k: v for k, v in (pricing or {}).items() if v is not None} or None
    replicas = _num((summary.get("target") or {}).get("replicas"))

    per_drill: list[dict[str, Any]] = []
    total_req = 0.0
    total_failed = 0.0
    for d in drills:
        fig = d.get("figures") or {}
        rec_value, rec_name = _recovery(fig)
        requests = _num(fig.get("requests")) or 0.0
        err = _num(fig.get("error_rate"))
        logical, req_avail = (
            _num(fig.get("logical_requests")),
            _num(fig.get("request_availability")),
        )
        if logical and req_avail is not None:
            # the drill retried: users felt a request's final outcome, not its failed attempts
            total_req += logical
            total_failed += (1.0 - req_avail) * logical
        elif err is not None and requests:
            total_req += requests
            total_failed += err * requests
        load = drill_load_stats(run_dir / str(d.get("name"))) if run_dir is not None else None
        qps = load["qps"] if load else None
        if qps is None and requests:
            start, end = _ts(d.get("started_at")), _ts(d.get("ended_at"))
            avail = _num(fig.get("availability"))
            if start is not None and end is not None and end > start and avail is not None:
                qps = requests * avail / (end - start)
        hyp = d.get("hypothesis") or {}
        per_drill.append(
            {
                "name": d.get("name"),
                "status": d.get("status"),
                "requests": int(requests),
                "error_rate": err,
                "p50_e2e_s": _num(fig.get("p50_e2e_s")),
                "p99_e2e_s": _num(fig.get("p99_e2e_s")),
                "recovery_s": rec_value if rec_value != inf else None,
                "never_recovered": rec_value == inf,
                "recovery_figure": rec_name,
                "tolerated": hyp.get("after") if isinstance(hyp, dict) else None,
                "budget_cost_s": _num(fig.get("budget_cost_s")),
                "budget_share": _num(fig.get("budget_share")),
                "qps": qps,
                "qps_source": "records" if load and load["qps"] is not None else "summary",
                "load": load,
            }
        )

    err_all = (total_failed / total_req) if total_req else None
    p99s = [p["p99_e2e_s"] for p in per_drill if p["p99_e2e_s"] is not None]
    # judged drills: passed or failed (inconclusive, error and aborted ones answered nothing:
    # they lower the share and keep the tiers from PASS, never count as held)
    tolerated = [p for p in per_drill if p["status"] in JUDGED]
    held = sum(1 for p in tolerated if p["status"] == "passed")
    grey = len(per_drill) - len(tolerated)
    grey_note = _not_judged_note(per_drill)
    # the zero-loss rule is the strict policy's: under the default one each drill judges what
    # its fault cost the error budget, and so does the error-budget row below
    strict = any(_policy_name(d) == "strict" for d in drills)
    err_note = (
        "failed / attempted over all drills, fault windows included, each request by its "
        "final outcome where the client retried: what users felt during the game day"
    )
    if not strict:
        err_note += (
            "; shown, not judged under the default verdict policy (the faults' losses are "
            "judged by their error-budget cost; strict judges this row)"
        )
    stability = [
        _row(
            "error rate",
            err_all,
            "ratio",
            f"< {ERROR_RATE_REFERENCE:.1%}",
            (err_all < ERROR_RATE_REFERENCE) if err_all is not None and strict else None,
            err_note,
        ),
        _row(
            "P99 E2E latency",
            max(p99s) if p99s else None,
            "s",
            f"<= {P99_REFERENCE_S:g} s",
            (max(p99s) <= P99_REFERENCE_S) if p99s else None,
            "worst drill, successful requests",
        ),
        _recovery_row(per_drill),
        _budget_row(per_drill),
        _row(
            "disaster tolerance",
            (held / len(per_drill)) if per_drill else None,
            "ratio",
            "every drill passes its own criteria",
            False if held < len(tolerated) else (True if tolerated and not grey else None),
            f"{held} of {len(tolerated)} judged drills passed"
            + (f"; {grey_note}" if grey_note else ""),
        ),
    ]

    detection = scorecard_row(drills)  # the drills' alerts, where read (issue 31)
    if detection is not None:
        stability.append(detection)

    qps_values = [p["qps"] for p in per_drill if p["qps"] is not None]
    p50s = [p["p50_e2e_s"] for p in per_drill if p["p50_e2e_s"] is not None]
    performance = [
        _row(
            "QPS (achieved)",
            max(qps_values) if qps_values else None,
            "req/s",
            "plan production at 70% of the saturation peak",
            None,
            "highest drill; at the drill's offered load, not the saturation peak "
            "(run the three-phase load test for that)",
        ),
        _row(
            "P50 E2E latency",
            max(p50s) if p50s else None,
            "s",
            f"<= {P50_REFERENCE_S:g} s (chat)",
            (max(p50s) <= P50_REFERENCE_S) if p50s else None,
            "worst drill",
        ),
    ]
    performance.append(_cost_row(per_drill, pricing, replicas))
    tiers = [
        {
            "tier": 1,
            "name": "Stability",
            "rows": stability,
            "verdict": _tier_verdict(stability, grey),
            "not_judged": grey,
            "drills": per_drill,
        },
        {
            "tier": 2,
            "name": "Performance and cost",
            "rows": performance,
            "verdict": _tier_verdict(performance, grey),
            "not_judged": grey,
            "drills": per_drill,
        },
        {
            "tier": 3,
            "name": "Model quality",
            "rows": [],
            "verdict": "OUT OF SCOPE",
            "out_of_scope": True,
            "note": MODEL_QUALITY_NOTE,
            "drills": [],
        },
    ]
    return {"tiers": tiers, "pricing": pricing}


def _cost_row(
    per_drill: list[dict[str, Any]], pricing: dict[str, Any] | None, replicas: float | None
) -> dict[str, Any]:
    if not pricing:
        return _row(
            "cost per request",
            None,
            "",
            "lower is better",
            None,
            "not computed: no price given (price_per_1k_tokens or price_per_instance_hour)",
        )
    currency = str(pricing.get("currency") or "USD")
    loads = [p["load"] for p in per_drill if p.get("load")]
    per_1k = _num(pricing.get("price_per_1k_tokens"))
    if per_1k is not None:
        ok = sum(load["ok"] for load in loads)
        tokens = sum((load["mean_output_tokens"] or 0.0) * load["ok"] for load in loads)
        if ok:
            mean_tokens = tokens / ok
            return _row(
                "cost per request",
                per_1k * mean_tokens / 1000.0,
                currency,
                "lower is better",
                None,
                f"{per_1k:g} {currency} per 1k output tokens x {mean_tokens:.1f} mean output "
                "tokens per successful request",
            )
    per_hour = _num(pricing.get("price_per_instance_hour"))
    if per_hour is not None and replicas:
        ok = sum(load["ok"] for load in loads)
        hours = sum(load["load_s"] for load in loads) / 3600.0
        if ok:
            return _row(
                "cost per request",
                per_hour * replicas * hours / ok,
                currency,
                "lower is better",
                None,
                f"{per_hour:g} {currency} per instance-hour x {replicas:g} instances x "
                f"{hours * 3600:.0f} s of load / {ok} successful requests",
            )
    return _row(
        "cost per request",
        None,
        currency,
        "lower is better",
        None,
        "not computed: a price was given but no drill records (requests, tokens) to divide by",
    )
