"""Plots of the evidence bundle (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from chaoslib_infer.measure.metrics import per_second_series  # noqa: E402

__all__ = [
    "drill_plots",
    "latency_cdf_plot",
    "replica_count_plot",
    "replica_share_plot",
    "rel_time",
    "timeline_plot",
]

Marker = tuple[float, str, str]


def rel_time(t: float, t0: float) -> str:
    """``t`` as seconds since ``t0``: ``+12.345 s`` (``-0.500 s`` before it)."""
    return f"{t - t0:+.3f} s"


def _draw_markers(fig: Any, axes: list[Any], markers: list[Marker], t0: float, tag_ax: Any) -> None:
    """Dashed vertical lines on every axis, a numbered tag above ``tag_ax`` (staggered in three
    rows so that close markers stay legible) and a key right of the axes: ``n  +t s  label``."""
    from matplotlib.lines import Line2D

    handles, labels = [], []
    for i, (t, label, colour) in enumerate(sorted(markers, key=lambda m: m[0]), 1):
        x = t - t0
        for ax in axes:
            ax.axvline(x, color=colour, linestyle="--", linewidth=1.1, alpha=0.9)
        tag_ax.annotate(
            str(i),
            (x, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(0, 3 + 11 * ((i - 1) % 3)),
            textcoords="offset points",
            ha="center",
            va="bottom",
            fontsize=7,
            color="white",
            fontweight="bold",
            bbox={"boxstyle": "round,pad=0.2", "fc": colour, "ec": "none"},
            annotation_clip=False,
        )
        handles.append(Line2D([0], [0], color=colour, linestyle="--", linewidth=1.2))
        labels.append(f"{i}  {rel_time(t, t0)}  {label}")
    if handles:
        fig.legend(
            handles,
            labels,
            loc="upper left",
            bbox_to_anchor=(1.0, 0.93),
            fontsize=7.5,
            title="markers (s since drill start)",
            title_fontsize=8,
            frameon=False,
        )


def _save(fig: Any, out_png: Path) -> Path:
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return out_png


def timeline_plot(
    records: list[dict[str, Any]],
    out_png: Path,
    markers: list[tuple[float, str, str]],
    title: str,
    t0: float | None = None,
    t1: float | None = None,
) -> Path | None:
    """Draw the drill timeline: per-second P50/P99 end-to-end latency and ok/failed requests.

    Args:
        records: per-attempt records (unix-second times), bucketed by send time.
        out_png: where to write the PNG.
        markers: ``[(unix_time, label, colour)]`` vertical lines (fault injection, death,
            recovery), numbered above the plot and listed in a key beside it.
        title: plot title.
        t0: origin of the x axis (unix s; the drill start). None: the first send time.
        t1: the x axis reaches at least this time (unix s; the drill end). None: the last send.

    Returns:
        ``out_png``, or ``None`` when there are no records to plot.
    """
    if not records:
        return None
    first = min(float(r["sent_at"]) for r in records)
    end = max(float(r["sent_at"]) for r in records) + 1.0
    rows = per_second_series(records, first, end)
    if not rows:
        return None
    origin = first if t0 is None else float(t0)
    xs = [float(r["t"]) - origin for r in rows]
    mid = [x + 0.5 for x in xs]
    p50 = [r.get("p50_e2e_s") for r in rows]
    p99 = [r.get("p99_e2e_s") for r in rows]
    failed = [int(r.get("failed") or 0) for r in rows]
    ok = [int(r.get("ok") or 0) for r in rows]
    fig, (ax_lat, ax_cnt) = plt.subplots(
        2, 1, figsize=(10, 5.5), sharex=True, gridspec_kw={"height_ratios": [3, 2]}
    )
    ax_lat.plot(
        mid, [v if v is not None else float("nan") for v in p50], label="P50 E2E", color="#1f77b4"
    )
    ax_lat.plot(
        mid, [v if v is not None else float("nan") for v in p99], label="P99 E2E", color="#d62728"
    )
    ax_lat.set_ylabel("latency (s)")
    ax_lat.grid(alpha=0.3)
    ax_cnt.bar(xs, ok, width=0.9, align="edge", color="#2ca02c", label="ok")
    ax_cnt.bar(xs, failed, width=0.9, align="edge", bottom=ok, color="#d62728", label="failed")
    ax_cnt.set_ylabel("requests / s (by send time)")
    ax_cnt.set_xlabel("seconds since load start" if t0 is None else "seconds since drill start")
    ax_cnt.grid(alpha=0.3)
    right = max(xs[-1] + 1.0, (float(t1) - origin) if t1 is not None else 0.0)
    ax_cnt.set_xlim(min(0.0, xs[0]), right)
    shown = [m for m in markers if min(0.0, xs[0]) <= m[0] - origin <= right]
    _draw_markers(fig, [ax_lat, ax_cnt], shown, origin, ax_lat)
    ax_lat.legend(loc="upper left", fontsize=8)
    ax_cnt.legend(loc="upper left", fontsize=8)
    ax_lat.set_title(title, pad=40 if shown else 6)
    fig.tight_layout()
    return _save(fig, out_png)


def replica_count_plot(
    series: dict[str, Any],
    out_png: Path,
    title: str,
    t0: float,
    markers: list[tuple[float, str, str]] | None = None,
    lines: list[tuple[float, str, str]] | None = None,
) -> Path:
    """Draw serving replicas over time (a step line) with engine-ready and HAProxy-UP counts.

    Args:
        series: :func:`chaoslib_infer.evidence.figures.replica_count_series` output.
        out_png: where to write the PNG.
        title: plot title.
        t0: origin of the x axis (unix s; the drill start).
        markers: ``[(unix_time, label, colour)]`` as on the timeline.
        lines: horizontal reference lines ``[(replicas, label, colour)]`` (e.g. the planned
            instance count of a quota cut).

    Returns:
        ``out_png``.
    """
    xs = [float(t) - t0 for t in series["t"]]
    fig, ax = plt.subplots(figsize=(10, 3.6))
    ax.step(
        xs,
        series["serving"],
        where="post",
        linewidth=2.6,
        color="#2ca02c",
        alpha=0.75,
        label="serving (HAProxy UP and engine ready)"
        if series.get("lb_tracked")
        else "serving (engine ready; HAProxy state not recorded)",
    )
    ax.step(
        xs, series["ready"], where="post", linewidth=1.1, linestyle=":", color="#1f77b4",
        label="engine ready (recorder)",
    )  # fmt: skip
    if series.get("lb_up") is not None:
        ax.step(
            xs, series["lb_up"], where="post", linewidth=1.1, linestyle="-.", color="#ff7f0e",
            label="HAProxy UP (show stat)",
        )  # fmt: skip
    top = max([*series["serving"], *series["ready"], *(series.get("lb_up") or [0])], default=0)
    for value, label, colour in lines or []:
        ax.axhline(value, color=colour, linestyle=(0, (6, 3)), linewidth=1.3, label=label)
        top = max(top, int(value))
    ax.set_ylim(-0.3, top + 0.9)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("replicas")
    ax.set_xlabel("seconds since drill start")
    ax.set_xlim(min(0.0, xs[0]), xs[-1])
    ax.grid(alpha=0.3)
    shown = [m for m in markers or [] if xs[0] <= m[0] - t0 <= xs[-1]]
    _draw_markers(fig, [ax], shown, t0, ax)
    ax.legend(loc="lower left", fontsize=7.5, framealpha=0.85)
    ax.set_title(title, pad=40 if shown else 6)
    fig.tight_layout()
    return _save(fig, out_png)


def latency_cdf_plot(records: list[dict[str, Any]], out_png: Path, title: str) -> Path | None:
    """Draw the empirical CDF of E2E and TTFT latency over successful requests (log x axis).

    Returns:
        ``out_png``, or ``None`` without a successful request.
    """
    e2e = sorted(float(r["end_at"]) - float(r["sent_at"]) for r in records if r.get("ok"))
    ttft = sorted(
        float(r["first_token_at"]) - float(r["sent_at"])
        for r in records
        if r.get("ok") and r.get("first_token_at") is not None
    )
    if not e2e:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for values, label, colour in ((e2e, "E2E", "#1f77b4"), (ttft, "TTFT", "#ff7f0e")):
        if values:
            n = len(values)
            ax.step(
                values, [(i + 1) / n for i in range(n)], where="post", label=label, color=colour
            )
    ax.set_xscale("log")
    ax.set_xlabel("latency (s, log scale)")
    ax.set_ylabel("fraction of successful requests")
    for q in (0.5, 0.99):
        ax.axhline(q, color="#999", linewidth=0.8, linestyle=":")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    failed = sum(1 for r in records if not r.get("ok"))
    ax.set_title(f"{title} (failed, censored: {failed} of {len(records)})")
    fig.tight_layout()
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return out_png


def replica_share_plot(
    records: list[dict[str, Any]],
    out_png: Path,
    title: str,
    t0: float | None = None,
    markers: list[tuple[float, str, str]] | None = None,
) -> Path | None:
    """Draw per-second requests served by each replica (stacked), from the records' ``replica``.

    Shows the load balancer pouring traffic onto survivors. ``t0``: x-axis origin (unix s; the
    drill start; None: the first send); ``markers`` as on the timeline.

    Returns:
        ``out_png``, or ``None`` without replica data.
    """
    named = [r for r in records if r.get("ok") and r.get("replica")]
    if not named:
        return None
    start = min(float(r["sent_at"]) for r in records)
    origin = start if t0 is None else float(t0)
    replicas = sorted({str(r["replica"]) for r in named})
    n_sec = int(max(float(r["sent_at"]) for r in named) - start) + 1
    counts = {rep: [0] * n_sec for rep in replicas}
    for r in named:
        counts[str(r["replica"])][int(float(r["sent_at"]) - start)] += 1
    fig, ax = plt.subplots(figsize=(10, 3.2))
    xs = [start - origin + i for i in range(n_sec)]
    ax.stackplot(xs, *[counts[rep] for rep in replicas], labels=replicas, step="post")
    ax.set_xlabel("seconds since load start" if t0 is None else "seconds since drill start")
    ax.set_ylabel("successful requests / s")
    ax.legend(loc="upper left", fontsize=8, ncol=len(replicas))
    ax.grid(alpha=0.3)
    lo, hi = min(0.0, xs[0]), xs[-1] + 1.0
    ax.set_xlim(lo, hi)
    shown = [m for m in markers or [] if lo <= m[0] - origin <= hi]
    _draw_markers(fig, [ax], shown, origin, ax)
    ax.set_title(title, pad=40 if shown else 6)
    fig.tight_layout()
    return _save(fig, out_png)


def drill_plots(
    name: str,
    drill_dir: Path,
    records: list[dict[str, Any]],
    lab_events: list[dict[str, Any]],
    entry: dict[str, Any],
    target: dict[str, Any],
    t0: float | None,
    t1: float | None,
    stop: dict[str, Any] | None = None,
) -> tuple[list[tuple[Path, str]], list[tuple[str, str]]]:
    """Draw every plot of one drill into ``drill_dir``; say why any is left out.

    Plots: the timeline (``timeline.png``), the latency CDF (``latency_cdf.png``), the
    per-replica share (``replica_share.png``) and the replica count over time
    (``replica_count.png``, lab only: :func:`chaoslib_infer.evidence.figures.replica_count_series`
    with the kind's ``replica_lines`` and the configured replica count). The time plots share the
    x origin ``t0`` and the markers of :func:`chaoslib_infer.evidence.figures.timeline_markers`.
    A plot left out has its stale PNG removed.

    Args:
        name: drill name (plot titles).
        drill_dir: the drill folder (``faults.jsonl`` is read from it; PNGs written to it).
        records: the drill's attempt records.
        lab_events: the lab's ground-truth events ([] without a lab).
        entry: the drill's summary entry (``figures``, ``ground_truth``).
        target: the ``summary.json`` target block (``kind``: ``lab``, ``url``, ...).
        t0: drill start (unix s) or None (then the first send time).
        t1: drill end (unix s) or None.
        stop: the stop condition that aborted the drill, or None.

    Returns:
        ``(plots, omitted)``: ``[(png, caption)]`` in display order, ``[(caption, reason)]``.
    """
    from chaoslib_infer.evidence.detection_view import detection_markers
    from chaoslib_infer.evidence.figures import (
        kind_module,
        read_jsonl,
        replica_count_series,
        timeline_markers,
    )

    faults = read_jsonl(drill_dir / "faults.jsonl")
    figures = entry.get("figures") or {}
    ground = entry.get("ground_truth") or {}
    markers = timeline_markers(faults, lab_events, ground, figures, t0, t1, stop)
    markers += detection_markers(entry.get("detection"))  # alerts pending/firing (issue 31)
    sends = [float(r["sent_at"]) for r in records if isinstance(r.get("sent_at"), int | float)]
    origin = t0 if t0 is not None else (min(sends) if sends else None)
    plots: list[tuple[Path, str]] = []
    omitted: list[tuple[str, str]] = []

    def keep(png: Path | None, path: Path, caption: str, reason: str) -> None:
        if png is not None:
            plots.append((png, caption))
        else:
            path.unlink(missing_ok=True)
            omitted.append((caption, reason))

    path = drill_dir / "timeline.png"
    keep(
        timeline_plot(records, path, markers, f"{name}: latency and failures", origin, t1),
        path,
        "Timeline: per-second P50/P99 latency and failures, fault and recovery markers",
        "no request records",
    )
    path = drill_dir / "latency_cdf.png"
    keep(
        latency_cdf_plot(records, path, f"{name}: latency CDF"),
        path,
        "Latency CDF (E2E and TTFT) over successful requests",
        "no successful request",
    )
    path = drill_dir / "replica_share.png"
    keep(
        replica_share_plot(records, path, f"{name}: requests per replica", origin, markers),
        path,
        "Per-replica share of requests over time",
        "no successful request names its replica (the target sends no X-Replica-Id)",
    )
    path = drill_dir / "replica_count.png"
    caption = (
        "Replica count over time: serving replicas (HAProxy UP and engine ready), lab ground truth"
    )
    kind = str(target.get("kind") or "")
    series = None
    reason = ""
    if kind != "lab":
        reason = (
            f"the target is not the local lab (target kind: {kind or 'unknown'}): replica states "
            "are ground truth only the lab records (supervisor events, HAProxy show stat)"
        )
    elif origin is None:
        reason = "no drill start time and no request records to place it"
    else:
        end = t1 if t1 is not None else (max(sends) + 1.0 if sends else origin + 1.0)
        series = replica_count_series(lab_events, origin, end)
        if series is None:
            reason = "the lab's events (events.jsonl) name no replica: ground truth missing"
    png = None
    if series is not None and origin is not None:
        lines: list[tuple[float, str, str]] = []
        configured = target.get("replicas")
        if isinstance(configured, int) and configured > 0:
            lines.append((float(configured), f"configured replicas: {configured}", "#7f7f7f"))
        for k in dict.fromkeys(str(f.get("kind") or "") for f in faults):
            module = kind_module(k) if k else None
            if module is not None and hasattr(module, "replica_lines"):
                lines.extend(module.replica_lines(ground, figures))
        png = replica_count_plot(series, path, f"{name}: serving replicas", origin, markers, lines)
        if not series.get("lb_tracked"):
            caption += (
                " (this lab's recorder did not sample HAProxy: no lb_state events, so serving"
                " counts engine-ready replicas only)"
            )
    keep(png, path, caption, reason)
    return plots, omitted
