"""Figures and a plot of the Kubernetes observation (``k8s-observations.jsonl``, issue 4).

``compute`` runs when the fault log has a ``k8s-observation`` line (written by
``k8s_start_observation``); :func:`compute_scale_out` (module ``k8s_scale_out``) when it has a
``k8s-scale-out`` line (``k8s_wait_scale_out``). :func:`observation_plots` draws the ready endpoints
over time with restarts, OOM kills, node NotReady windows and events; ``render.render_drill`` adds
it to the drill's plots when the file exists.

The instant figures are measured from (``t0``) is the drill's fault: the earliest ``fault_at`` of
the fault log other than the observation's own lines (``k8s-observation``, ``k8s-recovery``,
``k8s-scale-out``); else the spike start of a ``k8s-scale-out`` line; else the observation start.
Figures are the cluster's own view (API state sampled every interval), prefixed ``k8s_``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from chaoslib_infer.measure.figkit import (
    MILESTONE,
    RECOVERY,
    DrillContext,
    Marker,
    mark,
    read_jsonl,
)
from chaoslib_infer.platforms.kubernetes.observe import (
    OBSERVATIONS_FILE,
    observation_figures,
    observation_series,
    read_observations,
)

__all__ = [
    "LEDGER_LABELS",
    "compute",
    "compute_scale_out",
    "markers",
    "observation_plots",
    "observation_t0",
    "scale_out_markers",
]

#: The observation's line is no fault: its start gets no "fault injected" marker (it carries
#: ``started_at``, not ``fault_at``); these labels only apply to a ledger event, which it has none.
LEDGER_LABELS = ("observation started", "observation stopped")

_OWN_KINDS = {"k8s-observation", "k8s-recovery", "k8s-scale-out"}

#: observation_figures key -> figure name (flat values land in the evidence's figures table).
_NAMES = {
    "samples": "k8s_observation_samples",
    "interval_s": "k8s_observation_interval_s",
    "baseline_ready": "k8s_ready_endpoints_baseline",
    "ready_min": "k8s_ready_endpoints_min",
    "ready_max": "k8s_ready_endpoints_max",
    "below_baseline_s": "k8s_ready_below_baseline_s",
    "first_below_after_s": "k8s_ready_first_below_after_s",
    "ready_recovered_after_s": "k8s_ready_recovered_after_s",
    "still_below_at_end": "k8s_ready_still_below_at_end",
    "restarts_total": "k8s_restarts",
    "restarts": "k8s_restarts_by_pod",
    "oomkilled_pods": "k8s_oomkilled_pods",
    "node_notready_s": "k8s_node_notready_s",
    "node_notready_windows": "k8s_node_notready_windows",
    "events": "k8s_events",
    "events_by_reason": "k8s_events_by_reason",
    "hpa_desired_max": "k8s_hpa_desired_max",
    "errors": "k8s_observation_errors",
}


def observation_t0(faults: list[dict[str, Any]]) -> tuple[float | None, str]:
    """The instant observation figures are measured from, and where it comes from.

    Args:
        faults: the drill's fault log lines.

    Returns:
        ``(unix seconds or None, "<kind> fault_at" | "spike start" | "observation start")``.
    """
    drill = [
        f
        for f in faults
        if f.get("kind") not in _OWN_KINDS
        and "phase" not in f
        and isinstance(f.get("fault_at"), int | float)
    ]
    if drill:
        first = min(drill, key=lambda f: float(f["fault_at"]))
        return float(first["fault_at"]), f"{first['kind']} fault_at"
    spikes = [f for f in faults if f.get("kind") == "k8s-scale-out" and f.get("spike_at")]
    if spikes:
        return float(spikes[-1]["spike_at"]), "spike start"
    starts = [f for f in faults if f.get("kind") == "k8s-observation" and f.get("started_at")]
    if starts:
        return float(starts[-1]["started_at"]), "observation start"
    return None, "none"


def _path(run_dir: Path, entry: dict[str, Any] | None) -> Path:
    here = run_dir / OBSERVATIONS_FILE
    if here.exists() or entry is None or not entry.get("path"):
        return here
    return Path(str(entry["path"]))


def compute(ctx: DrillContext) -> tuple[dict[str, Any], dict[str, Any]]:
    """Figures of the observation file (see
    :func:`chaoslib_infer.platforms.kubernetes.observe.observation_figures`), renamed ``k8s_*``.

    Returns:
        ``(figures, ground_truth)``; ground truth: ``k8s_observed_from``, ``k8s_observed_to``,
        ``k8s_observation_t0`` (unix s) and ``k8s_observation_t0_from``.
    """
    entry = ctx.last_fault("k8s-observation")
    if entry is None:
        return {}, {}
    t0, origin = observation_t0(ctx.faults)
    raw = observation_figures(_path(ctx.run_dir, entry), t0 if t0 is not None else 0.0)
    figures = {_NAMES[k]: v for k, v in raw.items() if k in _NAMES}
    ground = {
        "k8s_observed_from": raw.get("observed_from"),
        "k8s_observed_to": raw.get("observed_to"),
        "k8s_observation_t0": t0,
        "k8s_observation_t0_from": origin,
    }
    return figures, ground


def markers(ground: dict[str, Any], figures: dict[str, Any]) -> list[Marker]:
    """Timeline marker: the ready endpoints back at their pre-fault count."""
    t0, back = ground.get("k8s_observation_t0"), figures.get("k8s_ready_recovered_after_s")
    if t0 is None or back is None:
        return []
    return mark(float(t0) + float(back), "ready endpoints back to baseline (k8s)", RECOVERY)


def scale_out_markers(ground: dict[str, Any], figures: dict[str, Any]) -> list[Marker]:
    """Timeline markers of ``k8s_wait_scale_out``: HPA decision, first new pod Ready, serving."""
    spike = ground.get("k8s_spike_at")
    if spike is None:
        return []
    out: list[Marker] = []
    for key, label, colour in (
        ("k8s_hpa_desired_at_s", "HPA desired replicas rose", MILESTONE),
        ("k8s_ready_at_s", "new pod Ready", RECOVERY),
        ("k8s_serving_at_s", "new pod serving (ready endpoint)", RECOVERY),
    ):
        if figures.get(key) is not None:
            out += mark(float(spike) + float(figures[key]), label, colour)
    return out


def compute_scale_out(ctx: DrillContext) -> tuple[dict[str, Any], dict[str, Any]]:
    """Figures of the last ``k8s_wait_scale_out`` (seconds after the spike start).

    Returns:
        Figures ``k8s_hpa_desired_at_s``, ``k8s_pod_created_at_s``, ``k8s_ready_at_s``,
        ``k8s_serving_at_s``, ``k8s_scale_out_completed_at_s``, ``k8s_new_ready_endpoints``,
        ``k8s_scale_out_timed_out``; ground truth ``k8s_spike_at``, ``k8s_spike_source``,
        ``k8s_hpa``, ``k8s_hpa_desired_before``, ``k8s_hpa_desired_after``.
    """
    entry = ctx.last_fault("k8s-scale-out")
    if entry is None:
        return {}, {}
    figures = {
        "k8s_hpa_desired_at_s": entry.get("hpa_desired_at_s"),
        "k8s_pod_created_at_s": entry.get("pod_created_at_s"),
        "k8s_ready_at_s": entry.get("ready_at_s"),
        "k8s_serving_at_s": entry.get("serving_at_s"),
        "k8s_scale_out_completed_at_s": entry.get("completed_at_s"),
        "k8s_new_ready_endpoints": entry.get("new_ready"),
        "k8s_scale_out_timed_out": bool(entry.get("timed_out")),
    }
    ground = {
        "k8s_spike_at": entry.get("spike_at"),
        "k8s_spike_source": entry.get("spike_source"),
        "k8s_hpa": entry.get("hpa"),
        "k8s_hpa_desired_before": entry.get("hpa_desired_before"),
        "k8s_hpa_desired_after": entry.get("hpa_desired_after"),
    }
    return figures, ground


def observation_plots(drill_dir: Path) -> list[tuple[Path, str]]:
    """Draw ``k8s_observation.png`` from ``drill_dir``'s observation file, if it has samples.

    Top: ready / not-ready endpoints and Ready pods per sample (and HPA desired replicas), pod
    restarts (red, OOM kills purple) and the fault as vertical lines, node NotReady windows shaded.
    Bottom: the namespace's events over time, one row per reason.

    Returns:
        ``[(png_path, caption)]``, or ``[]`` without an observation.
    """
    lines = read_observations(drill_dir / OBSERVATIONS_FILE)
    s = observation_series(lines)
    if not s["t"]:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    start = s["t"][0]
    xs = [t - start for t in s["t"]]

    def nan(vals: list[Any]) -> list[float]:
        return [float(v) if v is not None else float("nan") for v in vals]

    reasons = sorted({str(e["reason"]) for e in s["events"]})
    fig, (ax, ax_ev) = plt.subplots(
        2,
        1,
        figsize=(10, 4.5 + 0.18 * len(reasons)),
        sharex=True,
        gridspec_kw={"height_ratios": [3, 1 + 0.1 * len(reasons)]},
    )
    ax.step(xs, nan(s["ready"]), where="post", label="ready endpoints", color="#2ca02c")
    ax.step(xs, nan(s["not_ready"]), where="post", label="not-ready endpoints", color="#ff7f0e")
    ax.step(xs, nan(s["pods_ready"]), where="post", label="Ready pods", color="#1f77b4", ls=":")
    if any(v is not None for v in s["hpa_desired"]):
        ax.step(
            xs, nan(s["hpa_desired"]), where="post", label="HPA desired", color="#7f7f7f", ls="--"
        )
    for i, w in enumerate(s["node_windows"]):
        ax.axvspan(
            w["from"] - start,
            w["to"] - start,
            color="#d62728",
            alpha=0.12,
            label="node NotReady" if i == 0 else None,
        )
        ax.annotate(
            f"{w['node']} {w['state']}",
            (w["from"] - start, 0.02),
            xycoords=("data", "axes fraction"),
            fontsize=7,
            color="#d62728",
        )
    ooms = {(o["t"], o["pod"]) for o in s["oomkilled"]}
    for r in s["restarts"]:
        colour = "#9467bd" if (r["t"], r["pod"]) in ooms else "#d62728"
        ax.axvline(r["t"] - start, color=colour, lw=1, ls="--")
        ax.annotate(
            f"{r['pod'][-10:]} restart ({r['reason'] or '?'})",
            (r["t"] - start, 0.98),
            xycoords=("data", "axes fraction"),
            rotation=90,
            va="top",
            ha="right",
            fontsize=7,
            color=colour,
        )
    t0, origin = observation_t0(read_jsonl(drill_dir / "faults.jsonl"))
    if t0 is not None and origin != "observation start":
        ax.axvline(t0 - start, color="black", lw=1.2, label=origin)
    ax.set_ylabel("count")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=7)
    ax.set_title("Kubernetes observation: ready endpoints (EndpointSlices), restarts, nodes")
    for y, reason in enumerate(reasons):
        pts = [e for e in s["events"] if str(e["reason"]) == reason]
        ax_ev.scatter([e["t"] - start for e in pts], [y] * len(pts), s=[12 * e["new"] for e in pts])
    ax_ev.set_yticks(range(len(reasons)), reasons, fontsize=7)
    ax_ev.set_ylim(-0.8, max(len(reasons), 1) - 0.2)
    ax_ev.set_xlabel("seconds since observation start")
    ax_ev.grid(alpha=0.3)
    fig.tight_layout()
    out = drill_dir / "k8s_observation.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return [
        (
            out,
            "Kubernetes observation: ready endpoints, restarts, node NotReady windows, events",
        )
    ]
