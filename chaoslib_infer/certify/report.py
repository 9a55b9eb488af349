"""Score, rank and report certified targets side by side.

Scoring reuses the game day's tiered scorecard (``chaoslib_infer.evidence.scorecard``): each
phase is handed to it as a "drill" (figures, post-fault hypothesis for the fault phases, records
for QPS), then four rows are restated for a certification:

- tier 1 **error rate** is judged here, over the steady-state phases (single, ramp, soak:
  failed / attempted < the plan's ``slo.error_rate``); the fault phases' logical error rate is
  shown beside it, not judged (the faults are ours, on purpose);
- tier 2 **QPS** is the ramp's peak successful requests per second (closed loop), **P50** the
  soak's (else the single stream's), and **cost per request** uses a price per 1M input and
  output tokens: ``(in_price x input tokens + out_price x output tokens) / 1e6`` per successful
  request, output tokens from the records (``usage`` when sent), input tokens from the target's
  own ``prompt_tokens`` for two prompt sizes measured by the conformance probe.

P99, recovery time and disaster tolerance are the scorecard's own rows (worst phase, worst
recovery of the burst and jitter phases, share of fault phases whose hypothesis held). Model
quality (tier 3) is out of scope.

**Ranking** (:func:`chaoslib_infer.certify.ranking.rank_targets`): usable targets first (the
conformance probe's critical checks), then stability (tier 1 verdict, failed tier-1 rows, steady
error rate, disaster tolerance, worst P99), then performance and cost (tier 2 verdict, peak QPS,
P50, cost); a figure measured over records decides only where its block-bootstrap confidence
intervals do not overlap (:mod:`chaoslib_infer.certify.significance`), else the targets tie on
it. Every pair is compared; a target ranks one more than the targets shown better than it.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import jinja2

from chaoslib_infer.evidence.render import fmt, write_atomic
from chaoslib_infer.evidence.scorecard import MODEL_QUALITY_NOTE, build_scorecard
from chaoslib_infer.load.records import read_records

from .plan import CertPlan
from .ranking import attach_intervals

__all__ = [
    "console_table",
    "rank_text",
    "render_report",
    "score_target",
]

_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("chaoslib_infer", "templates"),
    autoescape=jinja2.select_autoescape(["html.j2"]),
    keep_trailing_newline=True,
)


def _row(metric: str, value: float | None, unit: str, reference: str, passed: bool | None,
         note: str = "") -> dict[str, Any]:  # fmt: skip
    return {"metric": metric, "value": value, "unit": unit, "reference": reference,
            "passed": passed, "note": note}  # fmt: skip


def _verdict(rows: list[dict[str, Any]]) -> str:
    judged = [r["passed"] for r in rows if r["passed"] is not None]
    if not judged:
        return "NO DATA"
    return "PASS" if all(judged) else "FAIL"


def _phase(phases: list[dict[str, Any]], name: str) -> dict[str, Any] | None:
    return next((p for p in phases if p["name"] == name), None)


def _cost(phases: list[dict[str, Any]], tdir: Path, plan: CertPlan, price: dict[str, Any] | None,
          input_tokens: dict[str, Any] | None) -> dict[str, Any]:  # fmt: skip
    if not price:
        return _row("cost per request", None, "", "lower is better", None,
                    "not computed: no price in the target file (price.input_per_1m / output_per_1m)")  # fmt: skip
    cur = price.get("currency") or "USD"
    ok = 0
    out_tok = 0.0
    in_tok = 0.0
    sources: set[str] = set()
    for ph in phases:
        files: list[tuple[Path, int]] = []
        if ph["name"] == "soak":
            for cls, info in (ph.get("classes") or {}).items():
                files.append((tdir / "soak" / f"{cls}.jsonl", int(info["prompt_words"])))
        else:
            files.append((tdir / ph["records"], int(plan.request["prompt_words"])))
        for path, words in files:
            for r in read_records(path) if path.is_file() else []:
                if not r.get("ok"):
                    continue
                ok += 1
                out_tok += float(r.get("output_tokens") or 0)
                sources.add(str(r.get("tokens_source")))
                if input_tokens:
                    in_tok += input_tokens["base"] + input_tokens["per_word"] * words
    if not ok:
        return _row("cost per request", None, cur, "lower is better", None,
                    "not computed: no successful request")  # fmt: skip
    pin, pout = float(price.get("input_per_1m") or 0), float(price.get("output_per_1m") or 0)
    note = (f"{pin:g} {cur}/1M input x {in_tok / ok:.1f} + {pout:g} {cur}/1M output x "
            f"{out_tok / ok:.1f} tokens per successful request (output tokens from "
            f"{'/'.join(sorted(sources))})")  # fmt: skip
    if not input_tokens and pin:
        note += "; input price NOT applied: the target reported no prompt_tokens"
    value = (pin * in_tok + pout * out_tok) / 1e6 / ok
    return _row("cost per request", value, cur, "lower is better", None, note)


def score_target(result: dict[str, Any], tdir: Path, plan: CertPlan) -> dict[str, Any]:
    """The target's tiered scorecard (module docstring).

    Args:
        result: ``{"phases": [...], "target": describe(), "probe": {...}}``.
        tdir: the target's evidence folder (``<phase>/records.jsonl``).
        plan: the plan (SLO references).

    Returns:
        ``{"tiers": [...], "pricing"}`` as ``build_scorecard`` returns, rows restated.
    """
    phases = result["phases"]
    drills = []
    for ph in phases:
        f = ph["figures"]
        figs = {k: f.get(k) for k in ("requests", "error_rate", "availability", "p50_e2e_s",
                                      "p99_e2e_s", "recovery_s")}  # fmt: skip
        drills.append({
            "name": ph["name"],
            "status": "passed" if ph["held"] is not False else "deviated",
            "figures": {k: v for k, v in figs.items() if v is not None},
            "hypothesis": {"after": ph["held"]} if ph["kind"] == "fault" else {},
            "started_at": ph["started_at"],
            "ended_at": ph["ended_at"],
        })  # fmt: skip
    card = build_scorecard({"drills": drills, "target": {}}, tdir, pricing={})
    stab, perf = card["tiers"][0], card["tiers"][1]
    steady = [p for p in phases if p["kind"] == "steady" and p["stats"].get("requests")]
    req = sum(p["stats"]["requests"] for p in steady)
    failed = sum(p["stats"]["failed"] for p in steady)
    err = failed / req if req else None
    limit = plan.slo.error_rate if plan.slo.error_rate is not None else 0.001
    stab["rows"][0] = _row(
        "error rate (steady state)", err, "ratio", f"< {limit:.2%}",
        None if err is None else err < limit,
        f"{failed} failed of {req} attempts in {', '.join(p['name'] for p in steady) or 'no phase'}",
    )  # fmt: skip
    faults = [p for p in phases if p["kind"] == "fault"]
    lrows = [(p["figures"].get("logical_requests") or p["stats"]["requests"],
              p["figures"].get("logical_availability", p["figures"].get("availability")))
             for p in faults]  # fmt: skip
    lreq = sum(n for n, a in lrows if a is not None)
    lfail = sum(n * (1 - a) for n, a in lrows if a is not None)
    stab["rows"].insert(1, _row(
        "error rate under client faults", (lfail / lreq) if lreq else None, "ratio",
        "shown, not judged", None,
        "logical requests (after our retries) of the burst, jitter and timeouts phases",
    ))  # fmt: skip
    ramp = _phase(phases, "ramp")
    peak = ramp["figures"].get("peak_ok_rps") if ramp else None
    perf["rows"][0] = _row("peak QPS", peak, "req/s", "plan production at 70% of it", None,
                           "ramp, closed loop: highest successful req/s of a step")  # fmt: skip
    typical = _phase(phases, "soak") or _phase(phases, "single")
    p50 = typical["figures"].get("p50_e2e_s") if typical else None
    ref = plan.slo.p50_e2e_s if plan.slo.p50_e2e_s is not None else 2.0
    perf["rows"][1] = _row(
        "P50 E2E latency", p50, "s", f"<= {ref:g} s (chat)", None if p50 is None else p50 <= ref,
        f"{typical['name']} phase, successful requests" if typical else "no soak or single phase",
    )  # fmt: skip
    probe = result.get("probe") or {}
    perf["rows"][2] = _cost(phases, tdir, plan, result["target"].get("price"),
                            probe.get("input_tokens"))  # fmt: skip
    held = [p for p in faults if p["held"] is not None]
    for row in stab["rows"]:  # the scorecard speaks of drills: here they are phases
        row["note"] = row["note"].replace("drills", "phases").replace("drill", "phase")
        row["reference"] = row["reference"].replace("drill's", "fault phase's")
        if row["metric"] == "disaster tolerance":
            row["note"] = (
                f"{sum(1 for p in held if p['held'])} of {len(held)} fault phases "
                f"({', '.join(p['name'] for p in held) or 'none'}) held after the fault"
            )
    for tier in (stab, perf):
        tier["verdict"] = _verdict(tier["rows"])
        tier["drills"] = []
    card["tiers"][2]["note"] = MODEL_QUALITY_NOTE
    card["pricing"] = result["target"].get("price")
    attach_intervals(card, phases, tdir)
    return card


def _rowval(card: dict[str, Any], tier: int, metric: str) -> float | None:
    for r in card["tiers"][tier]["rows"]:
        if r["metric"] == metric:
            v = r["value"]
            return float(v) if isinstance(v, int | float) else None
    return None


def cell(row: dict[str, Any]) -> str:
    """A scorecard row's value as shown: a ratio in percent, anything else with its unit, then
    its 95 % confidence interval in brackets where it has one; "—" when the figure was not
    measured (never 0)."""
    v = row["value"]
    if v is None:
        return "—"
    ci = row.get("ci")
    if row["unit"] == "ratio":
        span = f" [{ci['lo'] * 100:.3g}, {ci['hi'] * 100:.3g}]" if ci else ""
        return f"{v * 100:.4g} %{span}"
    span = f" [{fmt(ci['lo'])}, {fmt(ci['hi'])}]" if ci else ""
    return f"{fmt(v)} {row['unit']}".strip() + span


def rank_text(target: dict[str, Any]) -> str:
    """A target's rank as shown: ``"1"``, or ``"1 (tie)"`` when it shares it."""
    return f"{target['rank']} (tie)" if target.get("tie") else str(target["rank"])


def _b64(path: Path) -> str | None:
    return base64.b64encode(path.read_bytes()).decode("ascii") if path.is_file() else None


def _side_by_side_png(fig: Any, ax: Any, title: str, path: Path, axis: str = "both") -> str | None:
    """Finish a side-by-side figure (grid on ``axis``, legend, ``title``), write it to ``path`` as
    a 110 dpi PNG, close it; its base64 text (None when no file came out)."""
    import matplotlib.pyplot as plt

    ax.grid(alpha=0.3, axis=axis)
    ax.legend(fontsize=8)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return _b64(path)


def _plots(out: Path, summary: dict[str, Any]) -> dict[str, Any]:
    """Per-target timelines, and the side-by-side latency CDF and per-phase P99 bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from chaoslib_infer.evidence.plots import timeline_plot

    plots: dict[str, Any] = {"timelines": {}}
    curves = []
    for t in summary["targets"]:
        tdir = out / t["name"]
        recs: list[dict[str, Any]] = []
        markers: list[tuple[float, str, str]] = []
        steady: list[float] = []
        for ph in t["phases"]:
            part = read_records(tdir / ph["records"]) if (tdir / ph["records"]).is_file() else []
            recs.extend(part)
            markers.append((ph["started_at"], ph["name"], "#888888"))
            markers.extend(
                (float(m[0]), str(m[1]), str(m[2]))
                for m in ph.get("markers") or []
                if not str(m[1]).startswith("c=")  # ramp steps: too many lines
            )
            if ph["kind"] == "steady":
                steady += [r["end_at"] - r["sent_at"] for r in part if r.get("ok")]
        if recs:
            png = timeline_plot(
                recs, tdir / "timeline.png", markers, f"{t['name']} ({t['target']['profile']})"
            )
            if png is not None:
                plots["timelines"][t["name"]] = _b64(png)
        if steady:
            curves.append((t["name"], sorted(steady)))
    if curves:
        fig, ax = plt.subplots(figsize=(8, 4))
        for name, vals in curves:
            n = len(vals)
            ax.step(vals, [(i + 1) / n for i in range(n)], where="post", label=name)
        ax.set_xscale("log")
        ax.set_xlabel("E2E latency of successful requests, steady phases (s, log scale)")
        ax.set_ylabel("fraction")
        for q in (0.5, 0.99):
            ax.axhline(q, color="#999", linewidth=0.8, linestyle=":")
        plots["cdf"] = _side_by_side_png(
            fig, ax, "Latency CDF, side by side", out / "compare-cdf.png"
        )
    names = [ph["name"] for t in summary["targets"] for ph in t["phases"]]
    order = list(dict.fromkeys(names))
    if order and summary["targets"]:
        fig, ax = plt.subplots(figsize=(9, 3.6))
        width = 0.8 / len(summary["targets"])
        for i, t in enumerate(summary["targets"]):
            by = {ph["name"]: ph["figures"].get("p99_e2e_s") for ph in t["phases"]}
            xs = [k + i * width for k in range(len(order))]
            ax.bar(xs, [by.get(n) or 0.0 for n in order], width=width, label=t["name"])
        ax.set_xticks([k + 0.4 - width / 2 for k in range(len(order))], order)
        ax.set_ylabel("P99 E2E (s)")
        plots["p99"] = _side_by_side_png(
            fig, ax, "P99 per phase, side by side", out / "compare-p99.png", axis="y"
        )
    return plots


def _side_by_side(summary: dict[str, Any]) -> dict[str, Any]:
    """Rows of the comparison tables: scorecard rows, conformance checks, phase figures."""
    targets = summary["targets"]
    tiers = []
    for k in range(2):
        metrics = list(
            dict.fromkeys(r["metric"] for t in targets for r in t["scorecard"]["tiers"][k]["rows"])
        )
        rows = []
        for m in metrics:
            cells = []
            ref = ""
            for t in targets:
                row = next(
                    (r for r in t["scorecard"]["tiers"][k]["rows"] if r["metric"] == m), None
                )
                if row is None:
                    cells.append({"text": "—", "passed": None, "note": ""})
                    continue
                ref = row["reference"]
                cells.append({"text": cell(row), "passed": row["passed"], "note": row["note"]})
            rows.append({"metric": m, "reference": ref, "cells": cells})
        tiers.append({
            "tier": k + 1,
            "name": targets[0]["scorecard"]["tiers"][k]["name"] if targets else "",
            "verdicts": [t["scorecard"]["tiers"][k]["verdict"] for t in targets],
            "rows": rows,
        })  # fmt: skip
    checks = list(dict.fromkeys(r["check"] for t in targets for r in t["probe"].get("rows", [])))
    conformance = []
    for c in checks:
        cells = []
        for t in targets:
            row = next((r for r in t["probe"].get("rows", []) if r["check"] == c), None)
            cells.append({"text": "—", "passed": None} if row is None else
                         {"text": f"{row['observed']} (want {row['expected']})", "passed": row["passed"]})  # fmt: skip
        conformance.append({"check": c, "cells": cells})
    keys = [
        ("requests", "attempts"), ("availability", ""), ("error_rate", ""), ("p50_e2e_s", "s"),
        ("p99_e2e_s", "s"), ("ok_rps", "req/s"), ("peak_ok_rps", "req/s"), ("shed_requests", ""),
        ("burst_p99_e2e_s", "s"), ("recovery_s", "s"), ("send_lag_p99_s", "s"),
        ("jitter_p99_e2e_s", "s"), ("jitter_logical_availability", ""), ("retries", ""),
        ("retried_requests", ""), ("succeeded_after_retry", ""), ("timed_out_attempts", ""),
        ("possible_duplicates", ""), ("retry_amplification", "x"), ("logical_availability", ""),
    ]  # fmt: skip
    phases = []
    for name in dict.fromkeys(ph["name"] for t in targets for ph in t["phases"]):
        rows = []
        for key, unit in keys:
            vals = []
            for t in targets:
                ph = next((p for p in t["phases"] if p["name"] == name), None)
                vals.append(None if ph is None else ph["figures"].get(key))
            if all(v is None for v in vals) and key not in ("requests",):
                continue
            rows.append({"figure": key, "unit": unit, "vals": [fmt(v) for v in vals]})
        held = []
        for t in targets:
            ph = next((p for p in t["phases"] if p["name"] == name), None)
            held.append(None if ph is None else ph["held"])
        phases.append({"name": name, "rows": rows, "held": held})
    return {"tiers": tiers, "conformance": conformance, "phases": phases}


def render_report(out: Path, summary: dict[str, Any]) -> tuple[Path, Path]:
    """Write ``report.html`` (self-contained: plots inlined) and ``report.md`` into ``out``.

    Returns:
        ``(html_path, md_path)``.
    """
    plots = _plots(out, summary)
    ctx = {
        "summary": summary,
        "table": _side_by_side(summary),
        "plots": plots,
        "fmt": fmt,
        "model_quality": MODEL_QUALITY_NOTE,
        "json": json,
        "rank_text": rank_text,
    }
    html = out / "report.html"
    md = out / "report.md"
    write_atomic(html, _ENV.get_template("certify.html.j2").render(**ctx))
    write_atomic(md, _ENV.get_template("certify.md.j2").render(**ctx))
    return html, md


def console_table(summary: dict[str, Any]) -> str:
    """Plain-text side-by-side table: one column per target (ranked order), tier rows, verdicts."""
    table = _side_by_side(summary)
    names = [t["name"] for t in summary["targets"]]
    width = max([18, *(len(n) + 2 for n in names)])
    head = f"{'':32}" + "".join(f"{n:>{width}}" for n in names)
    ranks = "".join(f"{rank_text(t):>{width}}" for t in summary["targets"])
    lines = [head, f"{'rank':32}" + ranks]
    for tier in table["tiers"]:
        lines.append(f"tier {tier['tier']}: {tier['name']}"[:32].ljust(32)
                     + "".join(f"{v:>{width}}" for v in tier["verdicts"]))  # fmt: skip
        for row in tier["rows"]:
            cells = "".join(
                f"{(c['text'] + ('' if c['passed'] is None else (' ok' if c['passed'] else ' NO'))):>{width}}"
                for c in row["cells"]
            )
            lines.append(f"  {row['metric']}"[:32].ljust(32) + cells)
    lines.append(
        f"{'tier 3: Model quality':32}" + "".join(f"{'out of scope':>{width}}" for _ in names)
    )
    lines.append(
        f"{'verdict':32}" + "".join(f"{t['verdict']:>{width}}" for t in summary["targets"])
    )
    for t in summary["targets"]:
        lines += [f"ranking: {t['name']} {note}" for note in t.get("ranking_note") or []]
    return "\n".join(lines)
