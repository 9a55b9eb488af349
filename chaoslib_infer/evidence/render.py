"""Render the evidence: per-drill Markdown + self-contained HTML, and the game day's index.html."""

from __future__ import annotations

import base64
import datetime as dt
import math
import os
from pathlib import Path
from typing import Any

import jinja2
import markupsafe

__all__ = ["fmt", "fmt_cell", "is_unix_time", "render_drill", "render_index", "write_atomic"]

_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("chaoslib_infer", "templates"),
    autoescape=jinja2.select_autoescape(["html.j2"]),
    keep_trailing_newline=True,
    trim_blocks=False,
)

_FIGURE_ORDER = [
    "requests",
    "availability",
    "error_rate",
    "timeout_rate",
    "censored_fraction",
    "not_sent",
    "load_cap",
    "load_max_in_flight",
    "load_cap_fill",
    "client_cpu_share",
    "client_runq_wait_share",
    "p50_e2e_s",
    "p95_e2e_s",
    "p99_e2e_s",
    "p999_e2e_s",
    "p50_ttft_s",
    "p99_ttft_s",
    "interruption_s",
    "failed_requests",
    "restart_s",
    "restart_s_ground_truth",
    "replica_exits",
    "replica_restarts",
    "exit_codes",
    "restarts_unserved",
    "crash_prompt_tokens",
    "crash_prompt_tokens_source",
    "warmup_ttft_s",
    "steady_ttft_p50_s",
    "duplicates",
    "rerun_generations",
    "fault_cut_generations",
    "fault_wasted_tokens",
    "frozen_completed",
]
# with retries, the per-request P99 goes right after the attempt P99 (its censored twin)
_FIGURE_ORDER.insert(_FIGURE_ORDER.index("p99_e2e_s") + 1, "p99_request_e2e_s")
_FIGURE_ORDER.insert(_FIGURE_ORDER.index("availability") + 1, "request_availability")

#: A number in this range is a unix time (2001-09-09 .. 2286-11-20), never a count or a duration.
_UNIX_MIN, _UNIX_MAX = 1.0e9, 1.0e10
#: Lists and dicts longer than this are cut in a table cell (summary.json keeps them whole).
_LIST_MAX = 8


def crit_text(value: Any, unit: Any, missing: str) -> str:
    """A criterion's value or threshold as text (:func:`chaoslib_infer.verdict.format_value`)."""
    from chaoslib_infer.verdict import format_value

    return format_value(value, unit, missing)


def fmt(value: Any) -> str:
    """Format a figure for a table: floats to 4 significant digits, None as an em dash."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float) and 1.0e9 < value < 1.0e10:  # a unix time: show it as UTC
        return dt.datetime.fromtimestamp(value, dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"
    if isinstance(value, float):
        if math.isnan(value):
            return "—"
        if math.isinf(value):
            return "∞"
        return f"{value:.4g}"
    return str(value)


def is_unix_time(value: Any) -> bool:
    """Whether ``value`` is a unix time in seconds (a number between 1e9 and 1e10)."""
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and _UNIX_MIN < value < _UNIX_MAX
    )


def _utc(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def fmt_cell(value: Any, t0: float | None, html: bool = False) -> str | markupsafe.Markup:
    """Format a figure or ground-truth value for a table cell, nested values included.

    Every unix time (:func:`is_unix_time`), at any depth of dicts and lists, reads ``+12.345 s``
    relative to ``t0`` (the drill start); in HTML the absolute UTC time is its tooltip (the
    Markdown states ``t0`` once, under the table). Other scalars as :func:`fmt`; dicts as
    ``key: value`` separated by ``; `` (a dict of dicts one per line in HTML), nested ones in
    braces; lists and dicts longer than 8 items cut, saying how many there are.

    Args:
        value: the cell's value.
        t0: drill start (unix s), or None to show times as UTC.
        html: return escaped HTML (``Markup``) instead of Markdown-safe text.

    Returns:
        The text (``|`` escaped for Markdown tables) or ``Markup``.
    """
    esc = markupsafe.escape if html else (lambda x: str(x).replace("|", "\\|"))

    def one(v: Any, depth: int) -> str:
        if is_unix_time(v):
            t = float(v)
            if t0 is None:
                return str(esc(_utc(t)))
            rel = f"{t - t0:+.3f} s"
            return f'<span title="{_utc(t)}">{rel}</span>' if html else rel
        if isinstance(v, dict):
            parts = [f"{esc(k)}: {one(x, depth + 1)}" for k, x in list(v.items())[:_LIST_MAX]]
            if not parts:
                return "—"
            if len(v) > _LIST_MAX:
                parts.append(f"… ({len(v)} in all)")
            if depth > 0:
                return "{" + ", ".join(parts) + "}"
            nested = any(isinstance(x, dict) for x in v.values())
            return ("<br>" if html and nested else "; ").join(parts)
        if isinstance(v, list | tuple):
            items = [one(x, depth + 1) for x in list(v)[:_LIST_MAX]]
            if len(v) > _LIST_MAX:
                items.append(f"… ({len(v)} in all)")
            return ", ".join(items) if items else "—"
        return str(esc(fmt(v)))

    text = one(value, 0)
    return markupsafe.Markup(text) if html else text


def _fmt_bool(value: bool | None) -> str:
    return "not run" if value is None else ("held" if value else "DID NOT HOLD")


def write_atomic(path: Path, text: str | bytes) -> None:
    """Write a file through a temporary sibling and an atomic rename (never a half-written file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    data = text.encode("utf-8") if isinstance(text, str) else text
    with tmp.open("wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def render_drill(
    drill_dir: Path,
    drill: dict[str, Any],
    target: dict[str, Any],
    title: str,
    slo_rows: dict[str, list[dict[str, Any]]],
    activities: list[dict[str, Any]],
    plots: list[tuple[Path, str]],
    omitted: list[tuple[str, str]] | None = None,
    t0: float | None = None,
) -> tuple[Path, Path]:
    """Write ``evidence.md`` and ``evidence.html`` (plots inlined as base64) into ``drill_dir``.

    ``plots`` is ``[(png_path, caption)]``, in display order (timeline first); ``omitted``
    ``[(caption, reason)]`` the plots left out, each shown with its reason. ``t0`` is the drill
    start (unix s): unix times in the figures and ground-truth tables read relative to it
    (:func:`fmt_cell`); None shows them as UTC.

    Returns:
        ``(markdown_path, html_path)``.
    """
    # Kubernetes observation hook (issue 4): its plot, when the drill wrote k8s-observations.jsonl
    from chaoslib_infer.evidence.kinds.k8s_observation import observation_plots

    plots = [*plots, *observation_plots(drill_dir)]
    figures = drill.get("figures") or {}
    figures_table = [(k, figures[k]) for k in _FIGURE_ORDER if k in figures]
    figures_table += [
        (k, v)
        for k, v in figures.items()
        if k not in _FIGURE_ORDER and k != "errors_by_class" and not isinstance(v, dict | list)
    ]
    ground = drill.get("ground_truth") or {}
    ctx = {
        "drill": drill,
        "target": target,
        "title": title,
        "slo_rows": slo_rows,
        "figures_table": figures_table,
        "errors": figures.get("errors_by_class") or {},
        "ground_table": list(ground.items()),
        "activities": activities,
        "plots": [
            {"name": p.name, "caption": c, "b64": base64.b64encode(p.read_bytes()).decode("ascii")}
            for p, c in plots
        ],
        "omitted": [{"caption": c, "reason": r} for c, r in omitted or []],
        "t0": t0,
        "t0_utc": _utc(t0) if t0 is not None else None,
        "fmt": fmt,
        "fmt_bool": _fmt_bool,
        "crit_value": lambda row: crit_text(row.get("value"), row.get("unit"), "unmeasured"),
        "crit_threshold": lambda row: crit_text(row.get("threshold"), row.get("unit"), "—"),
    }
    md = drill_dir / "evidence.md"
    html = drill_dir / "evidence.html"
    write_atomic(
        md,
        _ENV.get_template("evidence.md.j2").render(
            **ctx, cell=lambda v: fmt_cell(v, t0, html=False)
        ),
    )
    write_atomic(
        html,
        _ENV.get_template("evidence.html.j2").render(
            **ctx, cell=lambda v: fmt_cell(v, t0, html=True)
        ),
    )
    return md, html


def render_index(
    out_dir: Path,
    summary: dict[str, Any],
    verdict: str,
    pricing: dict[str, Any] | None = None,
) -> Path:
    """Write the game day's self-contained ``index.html``: the tiered scorecard
    (:mod:`chaoslib_infer.evidence.scorecard`; ``pricing`` default ``summary["pricing"]``), each
    drill's row and timeline (inlined), linking every drill's evidence."""
    from chaoslib_infer.evidence.scorecard import build_scorecard

    path = out_dir / "index.html"
    timelines = {}
    for d in summary.get("drills") or []:
        png = out_dir / str(d.get("name")) / "timeline.png"
        if d.get("name") and "/" not in str(d["name"]) and png.is_file():
            timelines[d["name"]] = base64.b64encode(png.read_bytes()).decode("ascii")
    card = build_scorecard(summary, out_dir, pricing)
    write_atomic(
        path,
        _ENV.get_template("index.html.j2").render(
            summary=summary, verdict=verdict, fmt=fmt, scorecard=card, timelines=timelines
        ),
    )
    return path
