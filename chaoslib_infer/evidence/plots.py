"""Plots of the evidence bundle (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from chaoslib_infer.measure.metrics import per_second_series  # noqa: E402

__all__ = ["timeline_plot"]


def timeline_plot(
    records: list[dict[str, Any]],
    out_png: Path,
    markers: list[tuple[float, str, str]],
    title: str,
) -> Path | None:
    """Draw the drill timeline: per-second P50/P99 end-to-end latency and failed requests.

    Args:
        records: per-attempt records (unix-second times).
        out_png: where to write the PNG.
        markers: ``[(unix_time, label, colour)]`` vertical lines (fault injection, death, recovery).
        title: plot title.

    Returns:
        ``out_png``, or ``None`` when there are no records to plot.
    """
    if not records:
        return None
    start = min(float(r["sent_at"]) for r in records)
    end = max(float(r["sent_at"]) for r in records) + 1.0
    rows = per_second_series(records, start, end)
    if not rows:
        return None
    xs = [float(r["t"]) - start for r in rows]
    p50 = [r.get("p50_e2e_s") for r in rows]
    p99 = [r.get("p99_e2e_s") for r in rows]
    failed = [int(r.get("failed") or 0) for r in rows]
    ok = [int(r.get("ok") or 0) for r in rows]
    fig, (ax_lat, ax_cnt) = plt.subplots(
        2, 1, figsize=(10, 5.5), sharex=True, gridspec_kw={"height_ratios": [3, 2]}
    )
    ax_lat.plot(
        xs, [v if v is not None else float("nan") for v in p50], label="P50 E2E", color="#1f77b4"
    )
    ax_lat.plot(
        xs, [v if v is not None else float("nan") for v in p99], label="P99 E2E", color="#d62728"
    )
    ax_lat.set_ylabel("latency (s)")
    ax_lat.grid(alpha=0.3)
    ax_cnt.bar(xs, ok, width=0.9, color="#2ca02c", label="ok")
    ax_cnt.bar(xs, failed, width=0.9, bottom=ok, color="#d62728", label="failed")
    ax_cnt.set_ylabel("requests / s (by send time)")
    ax_cnt.set_xlabel("seconds since load start")
    ax_cnt.grid(alpha=0.3)
    for i, (t, label, colour) in enumerate(markers):
        x = t - start
        for ax in (ax_lat, ax_cnt):
            ax.axvline(x, color=colour, linestyle="--", linewidth=1.2)
        ax_lat.annotate(
            label,
            (x, 1.0 - 0.3 * (i % 3)),
            xycoords=("data", "axes fraction"),
            rotation=90,
            va="top",
            ha="right",
            fontsize=8,
            color=colour,
        )
    ax_lat.legend(loc="upper left", fontsize=8)
    ax_cnt.legend(loc="upper left", fontsize=8)
    ax_lat.set_title(title)
    fig.tight_layout()
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return out_png


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


def replica_share_plot(records: list[dict[str, Any]], out_png: Path, title: str) -> Path | None:
    """Draw per-second requests served by each replica (stacked), from the records' ``replica``.

    Shows the load balancer pouring traffic onto survivors. Returns ``None`` without replica data.
    """
    named = [r for r in records if r.get("ok") and r.get("replica")]
    if not named:
        return None
    start = min(float(r["sent_at"]) for r in records)
    replicas = sorted({str(r["replica"]) for r in named})
    n_sec = int(max(float(r["sent_at"]) for r in named) - start) + 1
    counts = {rep: [0] * n_sec for rep in replicas}
    for r in named:
        counts[str(r["replica"])][int(float(r["sent_at"]) - start)] += 1
    fig, ax = plt.subplots(figsize=(10, 3.2))
    xs = list(range(n_sec))
    ax.stackplot(xs, *[counts[rep] for rep in replicas], labels=replicas, step="post")
    ax.set_xlabel("seconds since load start")
    ax.set_ylabel("successful requests / s")
    ax.legend(loc="upper left", fontsize=8, ncol=len(replicas))
    ax.grid(alpha=0.3)
    ax.set_title(title)
    fig.tight_layout()
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return out_png
