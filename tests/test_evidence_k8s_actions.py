"""The Kubernetes actions' own figures reach summary.json, the evidence and the timeline
(``chaoslib_infer.evidence.kinds.k8s_actions``).

One real drill through the command line (oom-kill on the fake API, as in
``tests/test_k8s_drills_e2e.py``); the other actions run in-process against the fake (the real
action writes its fault log), with the journal entry Chaos Toolkit would write around its real
output or its real ``ActivityFailed``. Each figure is checked against the value the action
returned; a failed action shows its one failure line; a malformed journal breaks nothing.
"""

from __future__ import annotations

import json
import re
import traceback
from pathlib import Path
from typing import Any

import pytest
from chaoslib.exceptions import ActivityFailed
from fake_k8s import FakeK8s, make_cluster, write_target
from k8s_sim import SimContainer
from test_k8s_drills_e2e import Kubelet, _run_drill, cluster  # noqa: F401 (fixture)

from chaoslib_infer.activities import k8s
from chaoslib_infer.evidence.figures import (
    RECOVERY,
    REMOVED,
    drill_figures,
    read_jsonl,
    timeline_markers,
    unix_time,
)
from chaoslib_infer.evidence.render import fmt
from chaoslib_infer.gameday import drill_evidence
from chaoslib_infer.load.ceiling import sim_engine

NS = "llm"
K8S_TARGET = {"kind": "kubernetes", "namespace": NS}


def _rel(t: float, t0: float) -> str:
    """A unix time as the evidence tables show it: seconds since the drill start."""
    return f"{t - t0:+.3f} s"


@pytest.mark.slow  # ~20 s: out of the fast tier
def test_oom_kill_drill_figures_reach_summary_evidence_and_timeline(
    tmp_path: Path,
    cluster: tuple[FakeK8s, dict[str, str]],  # noqa: F811
) -> None:
    fake, env = cluster
    fake.exec_handler = Kubelet(fake)
    with sim_engine(zero_latency=False, itl_s=0.002, output_tokens=8) as url:
        proc, out = _run_drill(tmp_path, env, "oom-kill", url)
    # one engine behind every pod: the OOM-killed pod's traffic cannot feel it (verdict/confirm.py),
    # so the drill is inconclusive (exit 3); its own figures still reach every piece of evidence
    assert proc.returncode == 3 and "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    assert "the fault did not reach the service's traffic" in proc.stdout
    run_dir = out / "oom-kill"
    journal = json.loads((run_dir / "journal.json").read_text())
    (oom,) = [
        r["output"] for r in journal["run"] if r["activity"]["name"] == "oom-kill-model-server"
    ]
    (drill,) = json.loads((out / "summary.json").read_text())["drills"]
    fig, ground = drill["figures"], drill["ground_truth"]
    for key in ("restart_s", "ready_s", "time_to_oom_s", "api_restart_s", "exit_code", "reason"):
        assert fig[f"k8s_oom_{key}"] == oom[key], key
    assert fig["k8s_oom_restart_count_before"] == oom["restart_count_before"] == 0
    assert fig["k8s_oom_restart_count_after"] == oom["restart_count_after"] == 1
    assert fig["k8s_oom_restarts"] == 1 and fig["k8s_oom_hog_mb"] == oom["hog_mb"]
    assert fig["k8s_oom_memory_limit_mib"] == oom["memory_limit_bytes"] / 2**20 == 24576
    assert ground["k8s_oom_killed_at"] == oom["oom_at"]
    assert ground["k8s_oom_ready_at"] == oom["ready_at"]
    assert ground["k8s_oom_source"] == "journal"
    (cleared,) = [f for f in read_jsonl(run_dir / "faults.jsonl") if f.get("phase") == "cleared"]
    assert ground["k8s_oom_cleared_at"] == cleared["at"]
    assert fig["k8s_oom_fault_held_s"] == round(cleared["at"] - oom["fault_at"], 3)
    # the evidence: figures table rows, times relative to the drill start
    md = (run_dir / "evidence.md").read_text()
    t0 = unix_time(drill["started_at"])
    assert t0 is not None
    assert f"| k8s_oom_restart_s | {fmt(oom['restart_s'])} |" in md
    assert f"| k8s_oom_ready_s | {fmt(oom['ready_s'])} |" in md
    assert f"| k8s_oom_ready_at | {_rel(oom['ready_at'], t0)} |" in md
    assert "k8s_oom_ready_s" in (run_dir / "evidence.html").read_text()
    # timeline: the OOM kill, the container Ready again, the rollback
    marks = timeline_markers(read_jsonl(run_dir / "faults.jsonl"), [], ground, fig)
    assert (oom["ready_at"], "container Ready again (k8s)", RECOVERY) in marks
    assert (cleared["at"], "fault removed (rollback)", REMOVED) in marks
    assert any(t == oom["oom_at"] and "OOM-killed" in label for t, label, _ in marks)


# -- the other actions, in-process against the fake ----------------------------------------------


@pytest.fixture()
def fake() -> Any:
    with FakeK8s(schedule_delay_s=0.1, ready_delay_s=0.15) as f:
        make_cluster(f, hpa="vllm")
        yield f


def _target(tmp_path: Path, fake: FakeK8s) -> str:
    kc = fake.write_kubeconfig(tmp_path / "kubeconfig")
    return str(write_target(tmp_path / "target.yaml", kc))


def _journal_entry(func: str, output: Any = None, exc: BaseException | None = None) -> dict:
    """A method entry as Chaos Toolkit writes it (``chaoslib.activity.run_activity``)."""
    entry: dict[str, Any] = {
        "activity": {
            "type": "action",
            "name": func.replace("_", "-"),
            "provider": {"type": "python", "module": "chaoslib_infer.activities.k8s", "func": func},
        },
        "status": "succeeded" if exc is None else "failed",
    }
    if exc is None:
        entry["output"] = output
    else:  # with its traceback: the evidence must show the last line only
        entry["exception"] = traceback.format_exception(type(exc), exc, exc.__traceback__)
    return entry


def _run(
    tmp_path: Path, name: str, func: str, target: str, **kwargs: Any
) -> tuple[Path, dict[str, Any] | None]:
    """Run the real action ``func`` with its run dir ``tmp_path/name``; write the journal."""
    run_dir = tmp_path / name
    cfg = {"infer_run_dir": str(run_dir)}
    out: dict[str, Any] | None = None
    try:
        out = getattr(k8s, func)(target_file=target, configuration=cfg, **kwargs)
        entry = _journal_entry(func, out)
    except ActivityFailed as exc:
        entry = _journal_entry(func, exc=exc)
    (run_dir / "journal.json").write_text(json.dumps({"status": "completed", "run": [entry]}))
    return run_dir, out


def _rollback(run_dir: Path, func: str, target: str) -> None:
    getattr(k8s, func)(target_file=target, configuration={"infer_run_dir": str(run_dir)})


def _check_recovery(fig: dict[str, Any], ground: dict[str, Any], out: dict[str, Any]) -> None:
    rec = out["recovery"]
    pods = rec["pods"]
    assert pods and fig["k8s_recovery_pods"] == len(pods) == rec["recovered"]
    assert fig["k8s_recovery_unrecovered"] == 0
    assert fig["k8s_recovery_total_s_max"] == rec["max_total_recovery_s"]
    assert fig["k8s_recovery_rescheduling_s_max"] == max(p["rescheduling_s"] for p in pods)
    assert fig["k8s_recovery_readiness_s_max"] == max(p["readiness_s"] for p in pods)
    for p in pods:
        row = ground[f"k8s_recovery_pod {p['pod']}"]
        assert row["replacement"] == p["replacement"]
        assert row["nodes"] == f"{p.get('node', out.get('node'))} -> {p['node_after']}"
        assert len(row) <= 8  # a table cell shows 8 fields
        for key in ("rescheduling_s", "readiness_s", "total_recovery_s", "ready_at"):
            assert row[key] == p[key], key
    # one marker per replacement Ready (those Ready within 50 ms share one: "a; b")
    marks = [(t, label) for t, label, c in timeline_markers([], [], ground, fig) if c == RECOVERY]
    for p in pods:
        assert any(t == p["ready_at"] and p["pod"] in label for t, label in marks), marks
    assert {t for t, _ in marks} <= {p["ready_at"] for p in pods}


def test_each_k8s_action_figures_equal_what_it_returned(tmp_path: Path, fake: FakeK8s) -> None:
    target = _target(tmp_path, fake)
    # simultaneous restarts: krkn-style per-pod timings, deletions at one instant
    run_dir, out = _run(tmp_path, "restarts", "k8s_simultaneous_restarts", target, poll_s=0.05)
    assert out is not None
    fig, ground = drill_figures(run_dir, [], [])
    _check_recovery(fig, ground, out)
    times = [d["deleted_at"] for d in out["deleted"]]
    assert fig["k8s_simultaneous_deleted"] == 2
    assert fig["k8s_simultaneous_delete_spread_s"] == round(max(times) - min(times), 4) < 0.05
    # drain (node-loss): evictions and the evicted model pod's recovery
    run_dir, out = _run(tmp_path, "drain", "k8s_drain_model_node", target, poll_s=0.05)
    assert out is not None
    _rollback(run_dir, "k8s_uncordon_node", target)
    fig, ground = drill_figures(run_dir, [], [])
    _check_recovery(fig, ground, out)
    assert fig["k8s_drain_evicted"] == len(out["drain"]["evicted"]) >= 1
    assert fig["k8s_drain_refused"] == 0 and fig["k8s_drain_s"] == out["drain"]["drain_s"]
    assert ground["k8s_drain_node"] == out["node"] and fig["k8s_drain_fault_held_s"] > 0
    # taint and node delete
    run_dir, out = _run(tmp_path, "taint", "k8s_taint_model_node", target, poll_s=0.05)
    assert out is not None
    _rollback(run_dir, "k8s_remove_node_taint", target)
    fig, ground = drill_figures(run_dir, [], [])
    _check_recovery(fig, ground, out)
    assert ground["k8s_taint"] == "chaos-infer.io/node-loss=true:NoExecute"
    run_dir, out = _run(tmp_path, "delete", "k8s_delete_model_node", target, poll_s=0.05)
    assert out is not None
    _rollback(run_dir, "k8s_restore_node", target)
    fig, ground = drill_figures(run_dir, [], [])
    _check_recovery(fig, ground, out)
    assert ground["k8s_node_delete_node"] == out["node"]
    # quota cut: before/after of each object
    run_dir, out = _run(
        tmp_path, "quota", "k8s_cut_quota", target, gpus=2, replicas=2, hpa_max_replicas=2
    )
    assert out is not None
    _rollback(run_dir, "k8s_restore_quota", target)
    fig, ground = drill_figures(run_dir, [], [])
    assert (fig["k8s_quota_gpus_before"], fig["k8s_quota_gpus_after"]) == (
        out["quota"]["before"],
        "2",
    )
    assert (fig["k8s_quota_replicas_before"], fig["k8s_quota_replicas_after"]) == (
        out["deployment"]["before"],
        2,
    )
    assert fig["k8s_quota_hpa_max_after"] == 2 and fig["k8s_quota_hpa_min_after"] == 2
    assert fig["k8s_quota_hpa_max_before"] == out["hpa"]["before"]
    # upstream-timeout: freeze (targets) and ingress block (policy, its creation time)
    pod = sorted(p["metadata"]["name"] for p in fake.pods(NS, "app=vllm"))[0]
    fake.exec_handler = SimContainer(pod)
    run_dir, out = _run(tmp_path, "freeze", "k8s_freeze_model_server", target, pod=pod)
    assert out is not None
    _rollback(run_dir, "k8s_thaw_model_server", target)
    fig, ground = drill_figures(run_dir, [], [])
    assert fig["k8s_freeze_stopped"] == len(out["stopped"]) == 2
    assert ground["k8s_freeze_targets"] == [f"{t['pid']} ({t['comm']})" for t in out["targets"]]
    assert ground["k8s_freeze_fault_at"] == out["fault_at"] and "k8s_freeze_cleared_at" in ground
    run_dir, out = _run(tmp_path, "ingress", "k8s_block_pod_ingress", target)
    assert out is not None
    _rollback(run_dir, "k8s_restore_pod_ingress", target)
    fig, ground = drill_figures(run_dir, [], [])
    assert ground["k8s_ingress_block_policy"] == out["policy"]
    assert fig["k8s_ingress_block_policy_after_s"] == round(out["created_at"] - out["fault_at"], 3)
    # a lab-style drill (no Kubernetes action) gets nothing from this module
    (tmp_path / "lab").mkdir()
    fig, ground = drill_figures(tmp_path / "lab", [], [])
    assert not [k for k in [*fig, *ground] if k.startswith("k8s_")] and "figure_errors" not in fig


def test_failed_action_shows_its_line_and_its_logged_figures(tmp_path: Path, fake: FakeK8s) -> None:
    target = _target(tmp_path, fake)
    # no pod can be Ready again within 0 s: the action logs its recovery, then fails
    run_dir, out = _run(
        tmp_path, "d", "k8s_simultaneous_restarts", target, recovery_timeout_s=0, poll_s=0.05
    )
    assert out is None
    journal = json.loads((run_dir / "journal.json").read_text())
    assert "Traceback" in "".join(journal["run"][0]["exception"])
    (rec,) = [f for f in read_jsonl(run_dir / "faults.jsonl") if f["kind"] == "k8s-recovery"]
    entry = drill_evidence(
        "d", "simultaneous-restarts.yaml", "t", run_dir, journal, None, K8S_TARGET, 1.0e9, 1.0e9
    )
    fig, ground = entry["figures"], entry["ground_truth"]
    line = fig["k8s_simultaneous_failed"]
    assert re.fullmatch(r"2 deleted pod\(s\) without a Ready replacement after 0 s: .+", line)
    assert ground["k8s_simultaneous_source"] == "faults.jsonl"
    assert fig["k8s_recovery_pods"] == 2 and fig["k8s_recovery_unrecovered"] == 2
    assert ground["k8s_recovery_unrecovered_pods"] == rec["unrecovered"]
    md = (run_dir / "evidence.md").read_text()
    assert f"| k8s_simultaneous_failed | {line} |" in md
    for pod in rec["unrecovered"]:  # one row per deleted pod, never Ready again
        assert f"| k8s_recovery_pod {pod} | total_recovery_s: —; rescheduling_s: —;" in md
    assert "Traceback" not in md and "Traceback" not in (run_dir / "evidence.html").read_text()


def test_malformed_or_partial_journal_and_fault_log(tmp_path: Path) -> None:
    run_dir = tmp_path / "d"
    run_dir.mkdir()
    faults = [
        {"kind": "k8s-oom-kill", "fault_at": 1.7e9, "pod": "p", "container": "c", "hog_mb": 9},
        {"kind": "k8s-oom-recovery", "fault_at": 1.7e9, "restart_s": "x", "ready_s": 2.5},
        {"kind": "k8s-node-taint", "fault_at": 1.7e9 + 1, "node": "n1"},
        {"kind": "k8s-recovery", "fault_at": 1.7e9 + 1, "pods": "not a list", "recovered": None},
        {"kind": "k8s-quota-cut", "fault_at": 1.7e9, "quota": ["bad"], "hpa": {"before": 4}},
        {"kind": "k8s-upstream-freeze", "phase": "cleared", "at": "later"},
    ]
    text = "\n".join(json.dumps(f) for f in faults) + '\n{"kind": "k8s-oom-kill", "fau'
    (run_dir / "faults.jsonl").write_text(text)
    for journal in ('{"run": [{"activity": ', '{"run": "no"}', "[1, 2]", None):
        if journal is None:
            (run_dir / "journal.json").unlink()
        else:
            (run_dir / "journal.json").write_text(journal)
        fig, ground = drill_figures(run_dir, [], [])
        assert "figure_errors" not in fig, fig
        # what the fault log holds, unreadable values as None
        assert fig["k8s_oom_ready_s"] == 2.5 and fig["k8s_oom_restart_s"] is None
        assert fig["k8s_oom_hog_mb"] == 9 and ground["k8s_oom_source"] == "faults.jsonl"
        assert fig["k8s_recovery_pods"] == 0 and fig["k8s_recovery_total_s_max"] is None
        assert ground["k8s_taint_node"] == "n1"
        assert fig["k8s_quota_hpa_max_before"] == 4 and "k8s_quota_gpus_before" not in fig
        assert timeline_markers(read_jsonl(run_dir / "faults.jsonl"), [], ground, fig)
    # an output that is not a dict, and an entry cut off by a signal (no status)
    runs = [
        {"activity": {"provider": {"func": "k8s_oom_kill"}}, "output": "odd", "status": "x"},
        {"activity": {"provider": {"func": "k8s_cut_quota"}}},
        {"activity": "nope"},
    ]
    (run_dir / "journal.json").write_text(json.dumps({"run": runs}))
    fig, ground = drill_figures(run_dir, [], [])
    assert fig["k8s_oom_failed"] == "status x (no exception text)"
    assert fig["k8s_quota_failed"] == "status cut-off (no exception text)"
    assert fig["k8s_oom_ready_s"] == 2.5 and "figure_errors" not in fig
