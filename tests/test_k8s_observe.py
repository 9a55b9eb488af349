"""Kubernetes observation (issue 4) against the HTTP-level fake API: the sampler's series while the
fake restarts, NotReadies and replaces pods; the probes; the traffic-spike scale-out timings; the
figures and the evidence section built from the observation file."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from chaoslib.exceptions import ActivityFailed
from fake_k8s import FakeK8s, make_cluster, write_target

from chaoslib_infer.activities import k8s, k8s_observe
from chaoslib_infer.errors import ConfigError
from chaoslib_infer.evidence.figures import drill_figures, read_jsonl, timeline_markers
from chaoslib_infer.evidence.kinds.k8s_observation import observation_plots
from chaoslib_infer.evidence.render import render_drill
from chaoslib_infer.load.schedule import profile_schedule
from chaoslib_infer.platforms.kubernetes.observe import (
    OBSERVATIONS_FILE,
    observation_figures,
    observation_series,
    read_observations,
)
from chaoslib_infer.platforms.kubernetes.target import load_target

INTERVAL, POLL = 0.05, 0.05
SLACK = 0.25  # scheduling noise of timers and threads on a busy 2-core CI box
RS = "vllm-7d9f8c6b5"
POD_A, POD_B, POD_C = f"{RS}-x0p9w", f"{RS}-k1p9w", f"{RS}-q2p9w"  # on gpu-a, gpu-b, gpu-c


def _setup(tmp_path: Path, fake: FakeK8s, **target: Any) -> tuple[str, dict[str, Any]]:
    kc = fake.write_kubeconfig(tmp_path / "kubeconfig")
    path = write_target(tmp_path / "target.yaml", kc, **target)
    return str(path), {"infer_run_dir": str(tmp_path / "run")}


def _obs_lines(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    return read_observations(Path(cfg["infer_run_dir"]) / OBSERVATIONS_FILE)


def _faults(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    text = (Path(cfg["infer_run_dir"]) / "faults.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


def _observer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("k8s-observe")]


def _after_baseline(fake: FakeK8s, delay_s: float, fn: Any) -> list[float]:
    """Run ``fn`` ``delay_s`` after the probe read its baseline (its first EndpointSlices LIST)
    in a thread; returns the list its start time lands in."""
    n = len(fake.calls("GET", "endpointslices"))
    fired: list[float] = []

    def run() -> None:
        deadline = time.monotonic() + 10
        while len(fake.calls("GET", "endpointslices")) <= n and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(delay_s)
        fired.append(time.time())
        fn()

    threading.Thread(target=run, daemon=True).start()
    return fired


def _squeeze(values: list[Any]) -> list[Any]:
    return [v for i, v in enumerate(values) if i == 0 or values[i - 1] != v]


def test_sampler_series_follows_oom_restart_node_notready_and_replacement(tmp_path: Path) -> None:
    with FakeK8s(schedule_delay_s=0.2, ready_delay_s=0.3, endpoint_delay_s=0.05) as fake:
        make_cluster(fake)
        target, cfg = _setup(tmp_path, fake, service="vllm")
        out = k8s_observe.k8s_start_observation(
            interval_s=INTERVAL, target_file=target, configuration=cfg
        )
        assert (out["ready"], out["pods"], out["nodes"], out["hpa"], out["errors"]) == (
            3,
            3,
            ["gpu-a", "gpu-b", "gpu-c"],
            None,
            {},
        )
        time.sleep(0.25)
        t_oom = time.time()
        fake.restart_container("llm", POD_A, "OOMKilled", down_s=0.4)
        time.sleep(0.7)
        t_nr = time.time()
        fake.set_node_ready("gpu-b", False)
        time.sleep(0.4)
        t_nr_end = time.time()
        fake.set_node_ready("gpu-b", True)
        time.sleep(0.3)
        # 0.4 s down, not 0.2: a 2-core CI box once starved the 0.05 s sampler through a 0.2 s gap
        fake.restart_container("llm", POD_A, "Error", down_s=0.4)
        time.sleep(0.6)
        k8s.k8s_simultaneous_restarts(
            pods=[POD_C], poll_s=0.02, target_file=target, configuration=cfg
        )
        time.sleep(0.2)
        t_stop = time.time()
        stopped = k8s_observe.k8s_stop_observation(configuration=cfg)
        assert stopped["running_before"] and stopped["stopped"] and stopped["reason"] == "stopped"
        assert _observer_threads() == []
        # the sampler only reads; the one write is the action's DELETE
        writes = [r for r in fake.requests if r.method != "GET"]
        assert [(r.method, r.path) for r in writes] == [
            ("DELETE", f"/api/v1/namespaces/llm/pods/{POD_C}")
        ]
        slices = fake.calls("GET", "endpointslices")
        assert {(r.path, tuple(r.query.items())) for r in slices} == {
            (
                "/apis/discovery.k8s.io/v1/namespaces/llm/endpointslices",
                (("labelSelector", "kubernetes.io/service-name=vllm"),),
            )
        }
        paths = {r.path for r in fake.requests}
        assert {"/api/v1/namespaces/llm/events", "/api/v1/nodes/gpu-b"} <= paths
        # the Deployment has no HPA: looked for once (by scaleTargetRef), then never read
        assert [r.path for r in fake.calls("GET", "horizontalpodautoscalers")] == [
            "/apis/autoscaling/v2/namespaces/llm/horizontalpodautoscalers"
        ]

    lines = _obs_lines(cfg)
    samples = [x for x in lines if x["type"] == "sample"]
    assert lines[0]["type"] == "start" and lines[0]["service"] == "vllm"
    assert lines[-1] == {
        "type": "stop",
        "t": lines[-1]["t"],
        "reason": "stopped",
        "samples": len(samples),
    }
    assert len(samples) >= 40  # ~2.9 s at 0.05 s
    # ready endpoints: 3 -> 2 (OOM restart) -> 3 -> 2 (node NotReady) -> 3 -> 2 (restart) -> 3
    # -> 2 (pod deleted) -> 3 (its replacement Ready, endpoint updated)
    assert _squeeze([s["ready"] for s in samples]) == [3, 2, 3, 2, 3, 2, 3, 2, 3]
    during = [s for s in samples if t_oom + 0.1 <= s["t"] <= t_oom + 0.3]
    assert during and all(
        s["ready"] == 2
        and s["pods"][POD_A]["ready"] is False
        and s["pods"][POD_A]["restarts"] == 1
        and s["pods"][POD_A]["last_reason"] == "OOMKilled"
        for s in during
    )
    assert [e["pod"] for e in during[0]["endpoints"]["not_ready"]] == [POD_A]
    nr = [s for s in samples if t_nr + 0.1 <= s["t"] <= t_nr_end - 0.05]
    assert nr and all(s["nodes"]["gpu-b"]["ready"] == "Unknown" and s["ready"] == 2 for s in nr)
    assert all(not s["pods"][POD_B]["ready"] for s in nr)
    last = samples[-1]
    assert last["t"] >= t_stop  # the stop takes one last sample: the end state
    assert POD_C not in last["pods"] and len(last["pods"]) == 3 and last["ready"] == 3
    replacement = next(n for n in last["pods"] if n not in (POD_A, POD_B))
    assert last["pods"][replacement]["restarts"] == 0 and last["pods"][replacement]["ready"]

    series = observation_series(lines)
    assert [(r["pod"], r["restarts"], r["delta"], r["reason"]) for r in series["restarts"]] == [
        (POD_A, 1, 1, "OOMKilled"),
        (POD_A, 2, 1, "Error"),
    ]
    # a sample's reads start at its "t" and last "took_s": the kill can land inside them
    assert -0.05 <= series["restarts"][0]["t"] - t_oom <= INTERVAL + SLACK
    events = [e for s in samples for e in s["events"]]
    pulled = [e for e in events if e["reason"] == "Pulled"]
    assert [(e["count"], e["new"]) for e in pulled] == [(1, 1), (2, 1)]  # aggregated: same uid
    assert pulled[0]["uid"] == pulled[1]["uid"] and pulled[0]["name"] == POD_A
    sched = next(e for e in events if e["reason"] == "Scheduled")
    assert sched["name"] == replacement and sched["event_time"] is not None
    assert sched["first_timestamp"] == sched["event_time"]  # new-style: no firstTimestamp

    fig = observation_figures(Path(cfg["infer_run_dir"]) / OBSERVATIONS_FILE, t_oom)
    assert fig["baseline_ready"] == 3 and (fig["ready_min"], fig["ready_max"]) == (2, 3)
    assert fig["restarts"] == {POD_A: 2} and fig["restarts_total"] == 2
    assert fig["oomkilled_pods"] == [POD_A]
    assert fig["events_by_reason"] == {
        "Created": 2,
        "Killing": 1,
        "NodeNotReady": 1,
        "Pulled": 2,
        "Scheduled": 1,
        "Started": 3,
        "SuccessfulCreate": 1,
    }
    (win,) = fig["node_notready_windows"]
    assert (win["node"], win["state"], win["open"]) == ("gpu-b", "Unknown", False)
    assert -0.05 <= win["from_s"] - (t_nr - t_oom) <= INTERVAL + SLACK
    assert abs(win["duration_s"] - 0.4) <= INTERVAL + SLACK
    # below baseline: 0.4 + 0.4 + 0.4 s of restarts and NotReady, plus the replacement's ~0.5 s
    assert 1.5 <= fig["below_baseline_s"] <= 1.7 + 0.6
    assert fig["first_below_after_s"] <= INTERVAL + SLACK and not fig["still_below_at_end"]
    assert fig["errors"] == {}
    assert fig["interval_s"] == pytest.approx(INTERVAL, abs=0.03)


def test_forbidden_events_recorded_per_sample_and_forbidden_pods_refused(tmp_path: Path) -> None:
    with FakeK8s() as fake:
        make_cluster(fake)
        target, cfg = _setup(tmp_path, fake, service="vllm")
        fake.forbid("list", "events")
        fake.forbid("list", "horizontalpodautoscalers")  # optional: the target names no hpa:
        out = k8s_observe.k8s_start_observation(
            interval_s=INTERVAL, target_file=target, configuration=cfg
        )
        assert out["hpa"] is None and out["errors"]["hpa"].startswith(
            "list horizontalpodautoscalers in namespace llm: permission denied"
        )
        err = out["errors"]["events"]
        assert err.startswith("list events in namespace llm: permission denied") and "\n" not in err
        assert 'cannot list resource "events"' in err and out["ready"] == 3
        time.sleep(0.3)
        stop = k8s_observe.k8s_stop_observation(configuration=cfg)
        samples = [x for x in _obs_lines(cfg) if x["type"] == "sample"]
        assert len(samples) >= 4 and stop["errors"] == {"events": len(samples), "hpa": 1}
        assert all(s["errors"].get("events") == err and s["ready"] == 3 for s in samples)
        assert all(len(s["pods"]) == 3 and s["events"] == [] for s in samples)
        fig = observation_figures(Path(cfg["infer_run_dir"]) / OBSERVATIONS_FILE, 0.0)
        assert fig["errors"] == {"events": len(samples), "hpa": 1} and fig["events"] == 0
        with pytest.raises(ActivityFailed) as exc:  # and no HPA figures: said in the line
            k8s_observe.k8s_wait_scale_out(
                timeout_s=0.1, poll_s=POLL, target_file=target, configuration=cfg
            )
        assert "; HPA not read (list horizontalpodautoscalers in namespace llm: permission" in str(
            exc.value
        )
        # nothing to observe without the pods: one line, no thread, nothing written
        n_lines = len(_obs_lines(cfg))
        fake.forbid("list", "pods")
        with pytest.raises(ActivityFailed) as exc:
            k8s_observe.k8s_start_observation(target_file=target, configuration=cfg)
        assert str(exc.value).startswith(
            "list pods -l app=vllm in namespace llm: permission denied"
        )
        assert "\n" not in str(exc.value)
        assert _observer_threads() == [] and len(_obs_lines(cfg)) == n_lines
        assert k8s_observe.k8s_stop_observation(configuration=cfg)["running_before"] is False


def test_stop_is_idempotent_max_duration_and_second_start(tmp_path: Path) -> None:
    with FakeK8s() as fake:
        make_cluster(fake)
        target, cfg = _setup(tmp_path, fake)  # no service: endpoints not read
        with pytest.raises(ActivityFailed, match="interval_s must be 0.05..600, got 0"):
            k8s_observe.k8s_start_observation(interval_s=0, target_file=target, configuration=cfg)
        out = k8s_observe.k8s_start_observation(
            interval_s=INTERVAL, max_duration_s=0.3, target_file=target, configuration=cfg
        )
        assert out["ready"] is None and out["pods"] == 3
        deadline = time.monotonic() + 3
        while _observer_threads() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _observer_threads() == []
        lines = _obs_lines(cfg)
        assert lines[-1]["type"] == "stop" and lines[-1]["reason"] == "max_duration"
        assert 0.3 <= lines[-1]["t"] - lines[0]["t"] <= 0.3 + SLACK + INTERVAL
        assert not any("endpointslices" in r.path for r in fake.requests)
        assert k8s_observe.k8s_stop_observation(configuration=cfg)["running_before"] is False
        first = k8s_observe.k8s_start_observation(
            interval_s=INTERVAL, target_file=target, configuration=cfg
        )
        again = k8s_observe.k8s_start_observation(
            interval_s=1.0, target_file=target, configuration=cfg
        )
        assert not first["already_running"] and again["already_running"]
        assert again["interval_s"] == INTERVAL and again["started_at"] == first["started_at"]
        assert k8s_observe.k8s_stop_observation(configuration=cfg)["running_before"] is True
        for _ in range(2):
            assert k8s_observe.k8s_stop_observation(configuration=cfg) == {
                "path": str(Path(cfg["infer_run_dir"]).resolve() / OBSERVATIONS_FILE),
                "running_before": False,
                "samples": 0,
                "errors": {},
                "reason": "no observation running",
                "stopped": True,
            }
        assert _observer_threads() == []
        lines = _obs_lines(cfg)
        assert [x["type"] for x in lines if x["type"] != "sample"] == [
            "start",
            "stop",
            "start",
            "stop",
        ]
        assert [f["kind"] for f in _faults(cfg)] == ["k8s-observation", "k8s-observation"]


def test_interpreter_exit_stops_the_sampler_and_writes_its_stop_line(tmp_path: Path) -> None:
    with FakeK8s() as fake:
        make_cluster(fake)
        target, cfg = _setup(tmp_path, fake, service="vllm")
        code = (
            "import time\nfrom chaoslib_infer.activities import k8s_observe as o\n"
            f"o.k8s_start_observation(interval_s=0.05, target_file={target!r}, "
            f"configuration={cfg!r})\ntime.sleep(0.3)\n"  # exits without a stop
        )
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 0, proc.stderr
    lines = _obs_lines(cfg)
    assert lines[0]["type"] == "start" and lines[-1]["type"] == "stop"
    assert lines[-1]["reason"] == "interpreter exit" and lines[-1]["samples"] >= 4


def test_probes_ready_endpoints_restarts_and_oomkilled(tmp_path: Path) -> None:
    with FakeK8s() as fake:
        fake.slice_size = 2  # the Service's endpoints split over two slices
        make_cluster(fake)
        target, cfg = _setup(tmp_path, fake, service="vllm")
        slices = fake.list("discovery.k8s.io", "endpointslices", "llm")
        assert [len(s["endpoints"]) for s in slices] == [2, 1]
        # a dual-stack copy of the same endpoints must not count the pods twice
        v6 = json.loads(json.dumps(slices[0]))
        v6["metadata"] = {**v6["metadata"], "name": "vllm-v6", "uid": "uid-v6"}
        v6["addressType"] = "IPv6"
        for i, ep in enumerate(v6["endpoints"]):
            ep["addresses"] = [f"fd00::{i + 1}"]
        fake.put("discovery.k8s.io", "endpointslices", v6)
        assert k8s_observe.k8s_ready_endpoints(target_file=target, configuration=cfg) == 3
        call = fake.calls("GET", "endpointslices")[-1]
        assert call.path == "/apis/discovery.k8s.io/v1/namespaces/llm/endpointslices"
        assert call.query["labelSelector"] == "kubernetes.io/service-name=vllm"
        assert k8s_observe.k8s_restart_counts(target_file=target, configuration=cfg) == {
            POD_A: 0,
            POD_B: 0,
            POD_C: 0,
        }
        assert k8s_observe.k8s_oomkilled_pods(target_file=target, configuration=cfg) == []
        fake.restart_container("llm", POD_B, "OOMKilled", down_s=0.3)
        assert k8s_observe.k8s_ready_endpoints(target_file=target, configuration=cfg) == 2
        assert k8s_observe.k8s_restart_counts(target_file=target, configuration=cfg)[POD_B] == 1
        assert k8s_observe.k8s_oomkilled_pods(target_file=target, configuration=cfg) == [POD_B]
        time.sleep(0.3 + SLACK)
        assert k8s_observe.k8s_ready_endpoints(target_file=target, configuration=cfg) == 3
        fake.forbid("list", "endpointslices")
        with pytest.raises(ActivityFailed) as exc:
            k8s_observe.k8s_ready_endpoints(target_file=target, configuration=cfg)
        assert str(exc.value).startswith(
            "list endpointslices of service llm/vllm: permission denied"
        )
        assert 'in API group "discovery.k8s.io"' in str(exc.value)
        target2, _ = _setup(tmp_path, fake)
        with pytest.raises(ActivityFailed, match="no 'service:'"):
            k8s_observe.k8s_ready_endpoints(target_file=target2, configuration=cfg)
        with pytest.raises(ActivityFailed, match="no 'service:'"):
            k8s_observe.k8s_wait_scale_out(target_file=target2, configuration=cfg)


def test_wait_scale_out_figures_ordered_and_within_poll_of_the_scripted_times(
    tmp_path: Path,
) -> None:
    with FakeK8s(schedule_delay_s=0.2, ready_delay_s=0.3, endpoint_delay_s=0.2) as fake:
        make_cluster(fake, hpa="keda-hpa-vllm")
        target, cfg = _setup(tmp_path, fake, service="vllm")
        run = Path(cfg["infer_run_dir"])
        run.mkdir(parents=True)
        spike = time.time()
        (run / "faults.jsonl").write_text(
            json.dumps({"kind": "traffic-spike", "fault_at": spike}) + "\n"
        )
        time.sleep(0.3)  # the endpoint controller's first slices (0.2 s after the pods)
        fired = _after_baseline(
            fake, 0.3, lambda: fake.hpa_rescale("llm", "keda-hpa-vllm", 4, scale_after_s=0.2)
        )
        out = k8s_observe.k8s_wait_scale_out(
            poll_s=POLL, timeout_s=10, target_file=target, configuration=cfg
        )
        assert fake.get("apps", "deployments", "vllm", "llm")["spec"]["replicas"] == 4
        hpa_calls = fake.calls("GET", "horizontalpodautoscalers")
        assert hpa_calls[0].path == "/apis/autoscaling/v2/namespaces/llm/horizontalpodautoscalers"
        assert {r.path for r in hpa_calls[1:]} == {
            "/apis/autoscaling/v2/namespaces/llm/horizontalpodautoscalers/keda-hpa-vllm"
        }
    assert out["spike_source"] == "traffic-spike fault (faults.jsonl)" and out["spike_at"] == spike
    assert (out["hpa"], out["hpa_desired_before"], out["hpa_desired_after"]) == (
        "keda-hpa-vllm",
        3,
        4,
    )
    assert (out["ready_before"], out["ready_after"], out["new_ready"]) == (3, 4, 1)
    assert not out["timed_out"] and out["new_pods"][0]["pod"] == f"{RS}-n0001"
    # ground truth: the HPA decided when the timer fired; its scale created the pod 0.2 s later;
    # scheduled 0.2 s and Ready 0.3 s after that; the endpoint followed 0.2 s later
    t_hpa = fired[0] - spike
    truth = {
        "hpa_desired_at_s": t_hpa,
        "pod_created_at_s": t_hpa + 0.2,
        "ready_at_s": t_hpa + 0.2 + 0.2 + 0.3,
        "serving_at_s": t_hpa + 0.2 + 0.2 + 0.3 + 0.2,
    }
    for key, value in truth.items():
        assert value - 0.02 <= out[key] <= value + POLL + SLACK, (key, out[key], value)
        assert out["sources"][key] == "poll"
    assert out["completed_at_s"] == out["serving_at_s"]
    order = [out[k] for k in truth]
    assert order == sorted(order) and len(set(order)) == 4
    logged = _faults(cfg)[-1]
    assert logged["kind"] == "k8s-scale-out" and logged["fault_at"] == spike
    assert logged["serving_at_s"] == out["serving_at_s"]


def test_wait_scale_out_timeout_one_line_and_spike_from_the_load_profile(tmp_path: Path) -> None:
    with FakeK8s() as fake:
        make_cluster(fake, hpa="vllm")
        target, cfg = _setup(tmp_path, fake, service="vllm", hpa="vllm")
        profile, seed = [[2, 5], [3, 10]], 3
        started = time.time() - 1.0
        first = profile_schedule([(2.0, 5.0), (3.0, 10.0)], seed)[0]
        run = Path(cfg["infer_run_dir"])
        run.mkdir(parents=True)
        (run / "records.jsonl").write_text(
            json.dumps({"request_id": "r1", "attempt": 1, "intended_at": started + first}) + "\n"
        )
        cfg.update(load_profile=profile, load_seed=seed)
        with pytest.raises(ActivityFailed) as exc:
            k8s_observe.k8s_wait_scale_out(
                timeout_s=0.3, poll_s=POLL, target_file=target, configuration=cfg
            )
        assert str(exc.value) == (
            "no scale-out within 0.3 s: 0 of 1 new ready endpoint(s); ready endpoints 3 -> 3; "
            "HPA vllm desired 3 -> 3, current 3; new pods: none"
        )
        logged = _faults(cfg)[-1]
        assert logged["timed_out"] and logged["spike_source"] == "load profile (records.jsonl)"
        assert logged["spike_at"] == pytest.approx(started + 2.0, abs=1e-6)
        assert logged["polls"] >= 4 and logged["serving_at_s"] is None
        # a pod the scheduler cannot place: seen, reported Pending; the spike is the call time
        for node in ("gpu-a", "gpu-b", "gpu-c"):
            with fake.lock:
                fake.objects[("", "nodes")][("", node)]["spec"]["unschedulable"] = True
        _after_baseline(fake, 0.05, lambda: fake.scale("llm", "vllm", 4))
        cfg.pop("load_profile")
        before = time.time()
        with pytest.raises(ActivityFailed) as exc:
            k8s_observe.k8s_wait_scale_out(
                timeout_s=0.3, poll_s=POLL, target_file=target, configuration=cfg
            )
        assert str(exc.value).endswith(f"new pods: {RS}-n0001 Pending on -")
        logged = _faults(cfg)[-1]
        assert logged["spike_source"] == "call time" and logged["spike_at"] >= before
        assert logged["pod_created_at_s"] is not None and logged["ready_at_s"] is None
        with pytest.raises(ActivityFailed, match="min_new_ready >= 1"):
            k8s_observe.k8s_wait_scale_out(min_new_ready=0, target_file=target, configuration=cfg)
        target3, _ = _setup(tmp_path, fake, service="vllm", hpa="ghost")
        with pytest.raises(ActivityFailed) as exc:
            k8s_observe.k8s_wait_scale_out(target_file=target3, configuration=cfg)
        assert str(exc.value).startswith("get horizontalpodautoscaler llm/ghost: not found")


# -- figures from a hand-written observation file ---------------------------------------------


def _sample(t: float, ready: int | None, **kw: Any) -> dict[str, Any]:
    return {
        "type": "sample",
        "t": t,
        "ready": ready,
        "not_ready": None if ready is None else 3 - ready,
        "pods": kw.get("pods", {}),
        "nodes": kw.get("nodes", {}),
        "hpa": kw.get("hpa"),
        "events": kw.get("events", []),
        "errors": kw.get("errors", {}),
    }


def _pod(uid: str, restarts: int, last: str | None = None, reason: str | None = None) -> dict:
    return {"uid": uid, "ready": True, "restarts": restarts, "last_reason": last, "reason": reason}


def _write_observation(path: Path) -> None:
    up, nr = {"ready": "True"}, {"ready": "False"}
    rows = [
        {"type": "start", "t": 100.0},
        _sample(100, 3, pods={"p": _pod("u1", 0)}, nodes={"gpu-a": up, "gpu-b": up}),
        _sample(101, 3, pods={"p": _pod("u1", 0)}, nodes={"gpu-a": up, "gpu-b": up}),
        _sample(
            102,
            2,
            pods={"p": _pod("u1", 1, "OOMKilled")},
            nodes={"gpu-a": nr, "gpu-b": up},
            events=[{"reason": "Pulled", "new": 1}, {"reason": "Killing", "new": 1}],
        ),
        _sample(103, 2, pods={"p": _pod("u1", 1, "OOMKilled")}, nodes={"gpu-a": nr}),
        _sample(
            104,
            3,
            pods={"q": _pod("u2", 5)},
            nodes={"gpu-a": up, "gpu-b": up},
            errors={"events": "list events: permission denied"},
            hpa={"desired": 3},
        ),
        _sample(
            105,
            1,
            pods={"q": _pod("u2", 6, "Error")},
            nodes={"gpu-a": up, "gpu-b": {"ready": "Unknown"}},
            events=[{"reason": "Pulled", "new": 2}],
            hpa={"desired": 5},
        ),
        _sample(106, 3, pods={"q": _pod("u2", 6, "Error", "OOMKilled")}),
        {"type": "stop", "t": 106.5},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"type": "sam')  # torn line


def test_observation_figures_from_a_written_file(tmp_path: Path) -> None:
    path = tmp_path / OBSERVATIONS_FILE
    _write_observation(path)
    fig = observation_figures(path, 101.5)
    assert fig == {
        "samples": 7,
        "interval_s": 1.0,
        "observed_from": 100.0,
        "observed_to": 106.0,
        "baseline_ready": 3,
        "ready_min": 1,
        "ready_max": 3,
        "below_baseline_s": 3.0,  # [102, 104) and [105, 106)
        "first_below_after_s": 0.5,
        "ready_recovered_after_s": 4.5,
        "still_below_at_end": False,
        "restarts": {"p": 1, "q": 1},  # q first seen at 5 restarts: only its rise counts
        "restarts_total": 2,
        "oomkilled_pods": ["p", "q"],  # p restarted after an OOM kill; q entered OOMKilled
        "node_notready_windows": [
            {
                "node": "gpu-a",
                "from_s": 0.5,
                "to_s": 2.5,
                "duration_s": 2.0,
                "state": "False",
                "open": False,
            },
            {
                "node": "gpu-b",
                "from_s": 3.5,
                "to_s": 4.5,
                "duration_s": 1.0,
                "state": "Unknown",
                "open": True,
            },
        ],
        "node_notready_s": 3.0,
        "events_by_reason": {"Killing": 1, "Pulled": 3},
        "events": 4,
        "hpa_desired_max": 5,
        "errors": {"events": 1},
    }
    late = observation_figures(path, 104.5)  # baseline 3 (t=104); below at 105, back at 106
    assert (late["below_baseline_s"], late["ready_recovered_after_s"]) == (1.0, 1.5)
    # still below at the end: no recovery time, flagged
    trimmed = tmp_path / "trimmed.jsonl"
    trimmed.write_text("".join(line + "\n" for line in path.read_text().splitlines()[:7]))
    end = observation_figures(trimmed, 101.5)
    assert end["still_below_at_end"] and end["ready_recovered_after_s"] is None
    assert end["below_baseline_s"] == 2.0  # the last sample's interval is unknown: not counted
    after_end = observation_figures(path, 200.0)  # nothing sampled after t0: no dip to report
    assert after_end["baseline_ready"] == 3 and after_end["ready_min"] is None
    assert after_end["below_baseline_s"] is None and after_end["ready_recovered_after_s"] is None
    assert observation_figures(tmp_path / "missing.jsonl", 0.0) == {"samples": 0}
    no_service = tmp_path / "nosvc.jsonl"
    no_service.write_text(json.dumps(_sample(1.0, None)) + "\n")
    f = observation_figures(no_service, 0.0)
    assert f["samples"] == 1 and f["baseline_ready"] is None and f["below_baseline_s"] is None


def test_evidence_figures_plot_and_rendered_section(tmp_path: Path) -> None:
    drill = tmp_path / "simultaneous-restarts"
    drill.mkdir()
    _write_observation(drill / OBSERVATIONS_FILE)
    faults = [
        {
            "kind": "k8s-observation",
            "started_at": 100.0,
            "path": "/elsewhere/k8s-observations.jsonl",
        },
        {"kind": "k8s-simultaneous-restarts", "fault_at": 101.5, "pods": ["p"]},
        {"kind": "k8s-recovery", "fault_at": 101.5, "recovered": 1},
        {
            "kind": "k8s-scale-out",
            "fault_at": 99.0,
            "spike_at": 99.0,
            "spike_source": "call time",
            "hpa_desired_at_s": 0.4,
            "pod_created_at_s": 0.6,
            "ready_at_s": 1.1,
            "serving_at_s": 1.3,
            "completed_at_s": 1.3,
            "new_ready": 1,
            "timed_out": False,
            "hpa": "vllm",
            "hpa_desired_before": 3,
            "hpa_desired_after": 4,
        },
    ]
    (drill / "faults.jsonl").write_text("".join(json.dumps(f) + "\n" for f in faults))
    figures, ground = drill_figures(drill, [], [])
    assert figures["k8s_ready_below_baseline_s"] == 3.0 and figures["k8s_restarts"] == 2
    assert figures["k8s_ready_endpoints_min"] == 1 and figures["k8s_node_notready_s"] == 3.0
    assert figures["k8s_events_by_reason"] == {"Killing": 1, "Pulled": 3}
    assert figures["k8s_serving_at_s"] == 1.3 and figures["k8s_scale_out_timed_out"] is False
    assert ground["k8s_observation_t0"] == 101.5
    assert ground["k8s_observation_t0_from"] == "k8s-simultaneous-restarts fault_at"
    assert ground["k8s_spike_source"] == "call time" and "figure_errors" not in figures
    labels = {
        label: t
        for t, label, _ in timeline_markers(
            read_jsonl(drill / "faults.jsonl"), [], ground, figures, None, None
        )
    }
    assert labels["ready endpoints back to baseline (k8s)"] == 106.0  # 101.5 + 4.5
    assert labels["fault injected"] == 101.5 and labels["spike starts"] == 99.0
    assert labels["HPA desired replicas rose"] == pytest.approx(99.4)
    assert labels["new pod serving (ready endpoint)"] == pytest.approx(100.3)
    assert 100.0 not in labels.values()  # starting the observation is no fault
    (png, caption), *rest = observation_plots(drill)
    assert rest == [] and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert observation_plots(tmp_path) == []
    entry = {
        "name": "simultaneous-restarts",
        "experiment": "x.yaml",
        "status": "passed",
        "hypothesis": {"before": True, "after": True},
        "started_at": "a",
        "ended_at": "b",
        "figures": figures,
        "ground_truth": ground,
    }
    md, html = render_drill(
        drill, entry, {"kind": "kubernetes"}, "t", {"before": [], "after": []}, [], []
    )
    text = md.read_text()
    assert caption in text and "k8s_observation.png" in text
    assert "| k8s_ready_below_baseline_s | 3 |" in text
    assert f"<figcaption>{caption}</figcaption>" in html.read_text()


def test_target_service_and_hpa_keys_validated(tmp_path: Path) -> None:
    kc = FakeK8s().write_kubeconfig(tmp_path / "kubeconfig")  # a named kubeconfig must exist
    t = load_target(write_target(tmp_path / "t.yaml", kc, service="vllm", hpa="keda-hpa-vllm"))
    assert (t.service, t.hpa) == ("vllm", "keda-hpa-vllm")
    assert load_target(write_target(tmp_path / "t.yaml", kc)).service is None
    for key, bad, rule in (
        ("service", "Vllm_Svc", "a DNS-1035 label"),
        ("service", "9vllm", "a DNS-1035 label"),
        ("hpa", "keda/hpa", "a DNS-1123 subdomain"),
    ):
        with pytest.raises(ConfigError) as exc:
            load_target(write_target(tmp_path / "t.yaml", kc, **{key: bad}))
        assert str(exc.value) == (
            f"{tmp_path / 't.yaml'}: field {key!r} must be {rule} (a {key} name), got {bad!r}"
        )
