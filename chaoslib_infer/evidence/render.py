"""Render the evidence: per-drill Markdown + self-contained HTML, and the game day's index.html."""

from __future__ import annotations

import base64
import datetime as dt
import math
import os
from pathlib import Path
from typing import Any

import jinja2

__all__ = ["fmt", "render_drill", "render_index", "write_atomic"]

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
    "warmup_ttft_s",
    "steady_ttft_p50_s",
    "duplicates",
]


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
) -> tuple[Path, Path]:
    """Write ``evidence.md`` and ``evidence.html`` (plots inlined as base64) into ``drill_dir``.

    ``plots`` is ``[(png_path, caption)]``, in display order (timeline first).

    Returns:
        ``(markdown_path, html_path)``.
    """
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
        "fmt": fmt,
        "fmt_bool": _fmt_bool,
    }
    md = drill_dir / "evidence.md"
    html = drill_dir / "evidence.html"
    write_atomic(md, _ENV.get_template("evidence.md.j2").render(**ctx))
    write_atomic(html, _ENV.get_template("evidence.html.j2").render(**ctx))
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
