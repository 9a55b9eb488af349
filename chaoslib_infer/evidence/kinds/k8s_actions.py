"""Figures of the Kubernetes fault actions themselves (:mod:`chaoslib_infer.activities.k8s`).

Each action returns its own measurements (OOM kill and restart times, krkn-style per-pod
rescheduling / readiness / total recovery, quota values before and after, frozen processes...).
They are read from the drill's Chaos Toolkit journal (``journal.json``: the method's run entries,
by provider ``func``); when an action failed, or the journal is missing or partial (a killed run),
from what it wrote to ``faults.jsonl`` before (its injected line, its ``k8s-recovery`` /
``k8s-oom-recovery`` line). A failed action also gives a ``<prefix>_failed`` figure: the last line
of its exception, never a traceback.

Figures are flat and prefixed (``k8s_oom_*``, ``k8s_recovery_*``, ``k8s_simultaneous_*``,
``k8s_drain_*``, ``k8s_taint_*``, ``k8s_node_delete_*``, ``k8s_quota_*``, ``k8s_freeze_*``,
``k8s_ingress_block_*``, ``k8s_jitter_*``): durations in seconds, counts, quantities as the API
gave them. Ground truth holds identities (pod, node, policy...), the absolute times (unix s, shown
relative to the drill start in the evidence) and one row per deleted or evicted pod
(``k8s_recovery_pod <name>``). :func:`markers` puts the recovery points on the timeline.

``figures.drill_figures`` runs :func:`compute` for every drill (module name ``k8s-actions``, see
``figures._fault_kinds``); it returns nothing for a drill without a Kubernetes action.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from chaoslib_infer.drills import is_k8s_actions_module
from chaoslib_infer.measure import figkit
from chaoslib_infer.measure.figkit import DrillContext, Marker, mark

__all__ = ["ACTIONS", "LEDGER_LABELS", "compute", "markers", "read_journal"]

LEDGER_LABELS = ("fault injected", "fault removed")

#: Longest failure line kept (the journal keeps the whole exception).
_LINE_MAX = 400


def read_journal(ctx: DrillContext) -> dict[str, Any]:
    """The drill's ``journal.json`` as a dict; ``{}`` when absent, unreadable or not an object."""
    path = ctx.run_dir / "journal.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or v is None:
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _list(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []


def _after(t: Any, t0: Any) -> float | None:
    a, b = _num(t), _num(t0)
    return None if a is None or b is None else round(a - b, 3)


def _failure_line(run: dict[str, Any]) -> str:
    exc = run.get("exception")
    text = "".join(str(x) for x in exc) if isinstance(exc, list) else str(exc or "")
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    line = lines[-1] if lines else f"status {run.get('status') or 'cut-off'} (no exception text)"
    # "chaoslib.exceptions.ActivityFailed: <what it raised>: msg" -> the message an SRE needs
    for prefix in ("chaoslib.exceptions.ActivityFailed: ", "ActivityFailed: "):
        if line.startswith(prefix):
            line = line[len(prefix) :]
    return line if len(line) <= _LINE_MAX else line[: _LINE_MAX - 1] + "…"


# -- per action: (result) -> (figures, ground) ---------------------------------------------------


def _recovery(
    rec: dict[str, Any], fault_at: Any, node: Any = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """krkn-style figures of ``recovery_timings`` output (shared by restarts and node loss);
    ``node``: the node the pods were on (a drain's eviction rows do not name it)."""
    pods = [p for p in _list(rec.get("pods")) if isinstance(p, dict)]

    def top(key: str) -> float | None:
        vals = [v for v in (_num(p.get(key)) for p in pods) if v is not None]
        return max(vals) if vals else None

    totals = [v for v in (_num(p.get("total_recovery_s")) for p in pods) if v is not None]
    unrecovered = _list(rec.get("unrecovered"))
    fig: dict[str, Any] = {
        "k8s_recovery_pods": len(pods),
        "k8s_recovery_recovered": rec.get("recovered"),
        "k8s_recovery_unrecovered": len(unrecovered),
        "k8s_recovery_rescheduling_s_max": top("rescheduling_s"),
        "k8s_recovery_readiness_s_max": top("readiness_s"),
        "k8s_recovery_total_s_max": (
            _num(rec.get("max_total_recovery_s"))
            if "max_total_recovery_s" in rec
            else top("total_recovery_s")
        ),
        "k8s_recovery_total_s_mean": round(sum(totals) / len(totals), 3) if totals else None,
    }
    ground: dict[str, Any] = {}
    for p in pods:
        ground[f"k8s_recovery_pod {p.get('pod')}"] = {
            # 8 fields at most: a table cell shows 8 (the journal keeps the action's whole row)
            "total_recovery_s": p.get("total_recovery_s"),
            "rescheduling_s": p.get("rescheduling_s"),
            "readiness_s": p.get("readiness_s"),
            "replacement": p.get("replacement"),
            "nodes": f"{p.get('node') or node} -> {p.get('node_after')}",
            "deleted_at": p.get("deleted_at", fault_at),
            "scheduled_at": p.get("scheduled_at"),
            "ready_at": p.get("ready_at"),
        }
    if unrecovered:
        ground["k8s_recovery_unrecovered_pods"] = unrecovered
    return fig, ground


def _oom(r: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    before, after = r.get("restart_count_before"), r.get("restart_count_after")
    limit = _num(r.get("memory_limit_bytes"))
    fig = {
        "k8s_oom_time_to_oom_s": _num(r.get("time_to_oom_s")),
        "k8s_oom_restart_s": _num(r.get("restart_s")),
        "k8s_oom_ready_s": _num(r.get("ready_s")),
        "k8s_oom_api_restart_s": _num(r.get("api_restart_s")),
        "k8s_oom_restart_count_before": before,
        "k8s_oom_restart_count_after": after,
        "k8s_oom_restarts": (
            int(after) - int(before) if isinstance(after, int) and isinstance(before, int) else None
        ),
        "k8s_oom_reason": r.get("reason"),
        "k8s_oom_exit_code": r.get("exit_code"),
        "k8s_oom_hog_mb": r.get("hog_mb"),
        "k8s_oom_memory_limit_mib": round(limit / 2**20, 1) if limit is not None else None,
    }
    ground = {
        "k8s_oom_pod": f"{r.get('pod')} (container {r.get('container')})",
        "k8s_oom_fault_at": r.get("fault_at"),
        "k8s_oom_killed_at": r.get("oom_at"),
        "k8s_oom_running_at": r.get("running_at"),
        "k8s_oom_ready_at": r.get("ready_at"),
    }
    if r.get("warmup_omitted"):
        ground["k8s_oom_warmup_omitted"] = r["warmup_omitted"]
    return fig, ground


def _restarts(r: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    deleted = [d for d in _list(r.get("deleted")) if isinstance(d, dict)]
    times = [t for t in (_num(d.get("deleted_at")) for d in deleted) if t is not None]
    fig, ground = _recovery(_dict(r.get("recovery")), r.get("fault_at"))
    fig["k8s_simultaneous_deleted"] = len(deleted) if deleted else len(_list(r.get("pods")))
    fig["k8s_simultaneous_delete_spread_s"] = round(max(times) - min(times), 4) if times else None
    ground["k8s_simultaneous_fault_at"] = r.get("fault_at")
    return fig, ground


def _drain(r: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    d = _dict(r.get("drain"))
    fig, ground = _recovery(_dict(r.get("recovery")), r.get("fault_at"), r.get("node"))
    if d:
        fig["k8s_drain_evicted"] = len(_list(d.get("evicted")))
        fig["k8s_drain_refused"] = len(_list(d.get("refused")))
        fig["k8s_drain_skipped"] = len(_list(d.get("skipped")))
        fig["k8s_drain_s"] = _num(d.get("drain_s"))
        refused = [
            f"{x.get('namespace')}/{x.get('pod')}: {x.get('message')}"
            for x in _list(d.get("refused"))
            if isinstance(x, dict)
        ]
        if refused:
            ground["k8s_drain_refused_pods"] = refused
    ground["k8s_drain_node"] = r.get("node")
    ground["k8s_drain_fault_at"] = r.get("fault_at")
    return fig, ground


def _taint(r: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    fig, ground = _recovery(_dict(r.get("recovery")), r.get("fault_at"))
    t = _dict(r.get("taint")) or {"key": r.get("key"), "effect": r.get("effect")}
    ground["k8s_taint_node"] = r.get("node")
    ground["k8s_taint"] = f"{t.get('key')}={t.get('value', 'true')}:{t.get('effect')}"
    ground["k8s_taint_fault_at"] = r.get("fault_at")
    return fig, ground


def _node_delete(r: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    fig, ground = _recovery(_dict(r.get("recovery")), r.get("fault_at"))
    ground["k8s_node_delete_node"] = r.get("node")
    ground["k8s_node_delete_fault_at"] = r.get("fault_at")
    return fig, ground


def _quota(r: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    fig: dict[str, Any] = {}
    ground: dict[str, Any] = {"k8s_quota_fault_at": r.get("fault_at")}
    for part, name in (("quota", "gpus"), ("deployment", "replicas"), ("hpa", "hpa_max")):
        obj = _dict(r.get(part))
        if not obj:
            continue
        fig[f"k8s_quota_{name}_before"] = obj.get("before")
        fig[f"k8s_quota_{name}_after"] = obj.get("after")
        if part == "hpa":
            fig["k8s_quota_hpa_min_before"] = obj.get("min_before")
            fig["k8s_quota_hpa_min_after"] = obj.get("min_after")
        ground[f"k8s_quota_{part}"] = obj.get("name")
    if r.get("hpa_skipped"):
        ground["k8s_quota_hpa_skipped"] = r["hpa_skipped"]
    return fig, ground


def _freeze(r: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    targets = [t for t in _list(r.get("targets")) if isinstance(t, dict)]
    fig = {
        "k8s_freeze_stopped": len(_list(r.get("stopped"))) if "stopped" in r else None,
        "k8s_freeze_not_stopped": len(_list(r.get("not_stopped"))) if "stopped" in r else None,
        "k8s_freeze_ttl_s": _num(r.get("ttl_s")),
    }
    pids = [f"{t.get('pid')} ({t.get('comm')})" for t in targets] or _list(r.get("pids"))
    ground = {
        "k8s_freeze_pod": f"{r.get('pod')} (container {r.get('container')})",
        "k8s_freeze_targets": pids,
        "k8s_freeze_how": r.get("how"),
        "k8s_freeze_fault_at": r.get("fault_at"),
    }
    return fig, ground


def _ingress(r: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    fig = {"k8s_ingress_block_policy_after_s": _after(r.get("created_at"), r.get("fault_at"))}
    ground = {
        "k8s_ingress_block_pod": r.get("pod"),
        "k8s_ingress_block_policy": r.get("policy"),
        "k8s_ingress_block_fault_at": r.get("fault_at"),
        "k8s_ingress_block_labelled_at": r.get("labelled_at"),
        "k8s_ingress_block_created_at": r.get("created_at"),
    }
    return fig, ground


def _jitter(r: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    cmd = r.get("command")
    fig = {"k8s_jitter_exit_code": r.get("exit_code")}
    ground = {
        "k8s_jitter_pod": f"{r.get('pod')} (container {r.get('container')})",
        "k8s_jitter_command": " ".join(str(c) for c in cmd) if isinstance(cmd, list) else cmd,
        "k8s_jitter_fault_at": r.get("fault_at"),
    }
    return fig, ground


#: provider func -> (fault kind, figure prefix, recovery line kind or None, figure function).
ACTIONS: dict[str, tuple[str, str, str | None, Callable[[dict[str, Any]], tuple[dict, dict]]]] = {
    "k8s_oom_kill": ("k8s-oom-kill", "k8s_oom", "k8s-oom-recovery", _oom),
    "k8s_simultaneous_restarts": (
        "k8s-simultaneous-restarts",
        "k8s_simultaneous",
        "k8s-recovery",
        _restarts,
    ),
    "k8s_drain_model_node": ("k8s-node-loss", "k8s_drain", "k8s-recovery", _drain),
    "k8s_taint_model_node": ("k8s-node-taint", "k8s_taint", "k8s-recovery", _taint),
    "k8s_delete_model_node": ("k8s-node-delete", "k8s_node_delete", "k8s-recovery", _node_delete),
    "k8s_cut_quota": ("k8s-quota-cut", "k8s_quota", None, _quota),
    "k8s_freeze_model_server": ("k8s-upstream-freeze", "k8s_freeze", None, _freeze),
    "k8s_block_pod_ingress": ("k8s-upstream-ingress-block", "k8s_ingress_block", None, _ingress),
    "k8s_network_jitter": ("k8s-network-jitter", "k8s_jitter", None, _jitter),
}


def _from_faults(
    faults: list[dict[str, Any]], kind: str, recovery_kind: str | None
) -> dict[str, Any] | None:
    """The action's result as its fault-log lines give it (its last injected line, merged with
    the recovery line of the same ``fault_at``), or None when it logged nothing."""
    injected = [f for f in faults if f.get("kind") == kind and "phase" not in f]
    if not injected:
        return None
    result = dict(injected[-1])
    if recovery_kind is not None:
        rec = [
            f
            for f in faults
            if f.get("kind") == recovery_kind and f.get("fault_at") == result.get("fault_at")
        ]
        if rec:
            line = {k: v for k, v in rec[-1].items() if k != "kind"}
            if recovery_kind == "k8s-oom-recovery":
                result.update(line)
            else:
                result["recovery"] = line
                if isinstance(line.get("drain"), dict):
                    result["drain"] = line["drain"]
    return result


def compute(ctx: DrillContext) -> tuple[dict[str, Any], dict[str, Any]]:
    """Figures of every Kubernetes fault action the drill ran (see the module docstring).

    Args:
        ctx: the drill (its ``journal.json`` and fault log are read).

    Returns:
        ``(figures, ground_truth)``: e.g. ``k8s_oom_restart_s``, ``k8s_oom_ready_s`` (s after the
        OOM kill), ``k8s_recovery_total_s_max`` (s from the deletion / taint / drain to the last
        replacement Ready), ``k8s_quota_gpus_before``/``_after``, ``k8s_<action>_fault_held_s``
        (injection to rollback, s), ``k8s_<action>_failed`` (the failure line); ground truth as
        above plus ``k8s_<action>_source`` (``journal`` or ``faults.jsonl``). Both empty for a
        drill without a Kubernetes action.
    """
    journal = read_journal(ctx)
    runs: dict[str, dict[str, Any]] = {}
    for run in _list(journal.get("run")):
        provider = _dict(_dict(_dict(run).get("activity")).get("provider"))
        func = provider.get("func")
        if func in ACTIONS and is_k8s_actions_module(
            provider.get("module", "chaoslib_infer.activities.k8s")
        ):
            runs[str(func)] = run  # the last run of each action
    figures: dict[str, Any] = {}
    ground: dict[str, Any] = {}
    for func, (kind, prefix, rec_kind, fn) in ACTIONS.items():
        run = runs.get(func)
        output = _dict(run.get("output")) if run else {}
        source = "journal"
        if not output:
            output = _from_faults(ctx.faults, kind, rec_kind) or {}
            source = "faults.jsonl"
        if run is None and not output:
            continue
        if output:
            fig, grd = fn(output)
            figures.update(fig)
            ground.update(grd)
            ground[f"{prefix}_source"] = source
            cleared = [
                f.get("at")
                for f in ctx.faults
                if f.get("kind") == kind and f.get("phase") == "cleared"
            ]
            if cleared and _num(cleared[-1]) is not None:
                ground[f"{prefix}_cleared_at"] = cleared[-1]
                figures[f"{prefix}_fault_held_s"] = _after(cleared[-1], output.get("fault_at"))
        if run is not None and run.get("status") != "succeeded":
            figures[f"{prefix}_failed"] = _failure_line(run)
    return figures, ground


def markers(ground: dict[str, Any], figures: dict[str, Any]) -> list[Marker]:
    """Timeline markers of the actions' recovery points (all from ``ground``, unix s).

    OOM kill: container killed, running again, Ready again. Deleted / evicted pods: each
    replacement Ready (``deleted_at + total_recovery_s``). Every action: its rollback (``fault
    removed``); the fault's own start is marked from the fault log already.
    """
    out: list[Marker] = []
    out += mark(
        _num(ground.get("k8s_oom_killed_at")), "container OOM-killed (k8s)", figkit.MILESTONE
    )
    out += mark(_num(ground.get("k8s_oom_running_at")), "container running again", figkit.MILESTONE)
    out += mark(
        _num(ground.get("k8s_oom_ready_at")), "container Ready again (k8s)", figkit.RECOVERY
    )
    for key, row in ground.items():
        if not key.startswith("k8s_recovery_pod ") or not isinstance(row, dict):
            continue
        ready = _num(row.get("ready_at"))
        if ready is None:
            start, total = _num(row.get("deleted_at")), _num(row.get("total_recovery_s"))
            ready = start + total if start is not None and total is not None else None
        out += mark(ready, f"replacement of {key.split(' ', 1)[1]} Ready (k8s)", figkit.RECOVERY)
    for _kind, prefix, _rec, _fn in ACTIONS.values():
        out += mark(
            _num(ground.get(f"{prefix}_cleared_at")), "fault removed (rollback)", figkit.REMOVED
        )
    return out
