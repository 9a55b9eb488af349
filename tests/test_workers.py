"""Distributed load (`--workers N`): merged HDR histograms give exactly the percentiles one process
computes over the same records; local worker processes; the Kubernetes Indexed Job against the
fake API (its "kubelet" runs each pod's command as a local process)."""

from __future__ import annotations

import functools
import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from fake_k8s import FakeK8s, write_target

from chaoslib_infer.cli import main
from chaoslib_infer.load import workers
from chaoslib_infer.load.records import read_records
from chaoslib_infer.load.soak import StreamStats, stream_report
from chaoslib_infer.load.workers import (
    decode_stats,
    encode_stats,
    merge_stats,
    parse_result,
    run_local,
    shard_share,
)
from chaoslib_infer.platforms.kubernetes import load_job
from chaoslib_infer.platforms.kubernetes.load_job import run_k8s
from chaoslib_infer.platforms.kubernetes.target import load_target

SOAK = {"duration_s": 1.5, "rate": 24, "mix": "short:80,mid:20", "max_tokens_scale": 0.1}


def _records(n: int, seed: int = 1) -> list[dict[str, Any]]:
    """Synthetic attempt records: log-normal latencies, 3% errors (a third of them timeouts)."""
    rng = random.Random(seed)
    out = []
    t = 1_700_000_000.0
    for i in range(n):
        t += rng.expovariate(50)
        e2e = rng.lognormvariate(-1.5, 0.8)
        ok = rng.random() > 0.03
        ttft = e2e * rng.uniform(0.05, 0.3)
        chunks = [t + ttft + k * (e2e - ttft) / 7 for k in range(8)]
        out.append(
            {
                "request_id": f"r{i}", "attempt": 1, "final": True, "intended_at": t - 0.0004,
                "sent_at": t, "status": 200 if ok else 503, "ok": ok,
                "error_class": None if ok else rng.choice(["http_5xx", "timeout_ttft", "reset"]),
                "error": None if ok else "boom", "first_byte_at": t + ttft,
                "first_token_at": t + ttft if ok else None, "chunk_times": chunks if ok else [],
                "end_at": t + e2e, "output_tokens": 8 if ok else 0, "tokens_source": "usage",
                "replica": None, "text_len": 40,
            }
        )  # fmt: skip
    return out


def _stats(records: list[dict[str, Any]]) -> StreamStats:
    st = StreamStats()
    for r in records:
        st.add(r)
    return st


@pytest.mark.parametrize("n", [1, 3, 7])
def test_merged_shards_equal_one_process_exactly(n: int) -> None:
    records = _records(3000)
    rng = random.Random(n)
    shards: list[list[dict[str, Any]]] = [[] for _ in range(n)]
    for r in records:  # uneven, interleaved shards, as concurrent workers produce
        shards[rng.randrange(n)].append(r)
    # each shard's statistics travel as JSON (a worker's result line), then merge
    wire = [json.loads(json.dumps(encode_stats(_stats(s)))) for s in shards]
    merged = merge_stats(decode_stats(w) for w in wire).summary()
    one = stream_report(records)
    assert merged == one
    assert merged["requests"] == 3000 and 0 < merged["error_rate"] < 0.06
    assert merged["p99_e2e_s"] > merged["p50_e2e_s"] > 0
    if n > 1:  # the check can fail: a missing shard changes the result
        partial = merge_stats(decode_stats(w) for w in wire[1:]).summary()
        assert partial != one


def test_shard_share_and_result_line() -> None:
    assert [shard_share(10, k, 3) for k in range(3)] == [4, 3, 3]
    assert sum(shard_share(500, k, 7) for k in range(7)) == 500
    line = workers.MARKER + json.dumps({"shard": 1})
    assert parse_result(f"progress\n{line}\ntrailing\n") == {"shard": 1}
    assert parse_result("no result here") is None
    with pytest.raises(ValueError, match="malformed"):
        decode_stats({"h": {}})


def test_worker_bad_arguments_exit_2() -> None:
    p = subprocess.run(
        [sys.executable, "-m", "chaoslib_infer.load.workers", "soak", "--shard", "3/2",
         "--url", "http://127.0.0.1:9", "--out-dir", "/nonexistent"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert p.returncode == 2 and "expected 0 <= K < N" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and workers.MARKER not in p.stdout


@pytest.fixture(scope="module")
def engine() -> Any:
    from chaoslib_infer.load.ceiling import sim_engine

    with sim_engine(zero_latency=False, itl_s=0.002, output_tokens=8) as url:
        yield url


def test_local_workers_soak_merge_equals_one_process(engine: str, tmp_path: Path) -> None:
    env = {"CHAOS_INFER_ALLOW": None}
    r = CliRunner().invoke(
        main,
        ["load", "soak", "--target", engine, "--out", str(tmp_path), "--duration", "1.5s",
         "--rate", "24", "--mix", "short:80,mid:20", "--max-tokens-scale", "0.1",
         "--workers", "3", "--local", "--client-ceiling", "0"],
        env=env, catch_exceptions=False,
    )  # fmt: skip
    assert r.exit_code == 0, r.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["workers"] == 3 and report["valid"] is True
    shards = [read_records(tmp_path / f"shard-{k}" / "records.jsonl") for k in range(3)]
    assert all(len(s) > 3 for s in shards)
    union = read_records(tmp_path / "records.jsonl")
    assert len(union) == sum(len(s) for s in shards) == report["stats"]["requests"]
    assert report["stats"] == stream_report(union)  # merged histograms == one process's
    # each worker its own seed: different request ids/schedules, same ~rate share
    assert len({tuple(r["intended_at"] for r in s[:3]) for s in shards}) == 3
    assert json.loads(r.stdout.split("report:")[0]) == report["stats"]


def test_local_workers_three_phase(engine: str, tmp_path: Path) -> None:
    params = {
        "url": engine, "single_n": 3, "ramp": "3,6", "step_s": 0.6, "burst_rps": 30,
        "burst_s": 0.6, "max_tokens": 8, "timeout_s": 10,
    }  # fmt: skip
    report = run_local("three-phase", params, 3, tmp_path, start_delay_s=1.0)
    steps = {s["step"]: s for s in report["steps"]}
    assert list(steps) == ["single", "ramp-3", "ramp-6", "burst"]
    assert steps["single"]["workers"] == 1 and steps["single"]["stats"]["requests"] == 3
    for name in ("ramp-3", "ramp-6", "burst"):
        assert steps[name]["workers"] == 3
        union = [
            r for k in range(3) for r in read_records(tmp_path / f"shard-{k}" / f"{_file(name)}")
        ]
        # ok_rps is over the step's window (as one process's three-phase report has it)
        expected = {k: v for k, v in stream_report(union).items() if k != "ok_rps"}
        got = {k: v for k, v in steps[name]["stats"].items() if k != "ok_rps"}
        assert got == expected, name
    assert steps["burst"]["rate_rps"] == pytest.approx(30.0)
    # ramp-6 split 2+2+2 closed-loop workers: about twice ramp-3's throughput (1+1+1)
    assert steps["ramp-6"]["stats"]["requests"] > 1.3 * steps["ramp-3"]["stats"]["requests"]


def _file(step: str) -> str:
    # a worker names its ramp files by its own share: ramp-3 over 3 workers is ramp-1 in each
    if step.startswith("ramp-"):
        return f"ramp-{int(step[5:]) // 3}.jsonl"
    return f"{step}.jsonl"


# -- Kubernetes Indexed Job ----------------------------------------------------------------------


def _kubelet(tmp_path: Path) -> Any:
    """Run a Job pod's container like a kubelet would: $(VAR) expanded from the container's env,
    the emptyDir at a local folder; stdout and stderr become the pod log."""

    def run(pod: dict[str, Any]) -> tuple[int, str]:
        (c,) = pod["spec"]["containers"]
        env = {e["name"]: e["value"] for e in c.get("env") or []}
        argv = [
            re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in c["command"] + c["args"]
        ]
        assert argv[0] == "python"
        mount = tmp_path / "pods" / pod["metadata"]["name"]
        argv = [sys.executable, *(a.replace("/work/out", str(mount)) for a in argv[1:])]
        p = subprocess.run(
            argv, capture_output=True, text=True, timeout=60, env={**os.environ, **env}
        )
        return p.returncode, p.stderr + p.stdout

    return run


def test_indexed_job_on_the_fake_api(engine: str, tmp_path: Path) -> None:
    with FakeK8s() as fake:
        fake.run_pod = _kubelet(tmp_path)
        kubeconfig = fake.write_kubeconfig(tmp_path / "kubeconfig")
        target = load_target(write_target(tmp_path / "t.yaml", kubeconfig, url=engine))
        report = run_k8s(
            target, "soak", {"url": engine, **SOAK}, 2, tmp_path / "out", image="img:1",
            poll_s=0.1, start_delay_s=1.0,
        )  # fmt: skip
        calls = [(r.method, re.sub(r"load-\d+-0", "load-T-0", r.path)) for r in fake.requests]
        job_body = fake.requests[0].body
        assert fake.list("batch", "jobs") == [] and fake.pods("chaos-infer") == []
    base = "/apis/batch/v1/namespaces/chaos-infer/jobs"
    assert calls[0] == ("POST", base)
    assert set(calls[1:-4]) == {("GET", f"{base}/chaos-infer-load-T-0")}  # status polls
    assert calls[-4] == ("GET", "/api/v1/namespaces/chaos-infer/pods")
    logs = [c for c in calls if c[1].endswith("/log")]
    assert len(logs) == 2 and calls[-1] == ("DELETE", f"{base}/chaos-infer-load-T-0")
    spec = job_body["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"] == 2
    assert spec["backoffLimit"] == 0 and spec["activeDeadlineSeconds"] > 60
    (c,) = spec["template"]["spec"]["containers"]
    assert c["command"] == ["python", "-m", "chaoslib_infer.load.workers"]
    assert c["args"][:3] == ["soak", "--shard", "$(JOB_COMPLETION_INDEX)/2"]
    assert spec["template"]["spec"]["automountServiceAccountToken"] is False
    # the merged result equals one process over both pods' records
    union = [
        r
        for f in sorted((tmp_path / "pods").glob("*/shard-*/records.jsonl"))
        for r in read_records(f)
    ]
    assert len(list((tmp_path / "pods").glob("*/shard-*/records.jsonl"))) == 2
    assert report["workers"] == 2 and report["stats"] == stream_report(union)
    assert report["stats"]["requests"] > 10
    assert sorted(s["shard"] for s in report["shards"]) == [0, 1]
    assert len(list((tmp_path / "out").glob("worker-0-*.log"))) == 2


def test_failed_worker_pod_fails_the_run_and_deletes_the_job(tmp_path: Path) -> None:
    with FakeK8s() as fake:
        fake.run_pod = lambda pod: (1, "Traceback: something broke\n")
        kubeconfig = fake.write_kubeconfig(tmp_path / "kubeconfig")
        target = load_target(write_target(tmp_path / "t.yaml", kubeconfig))
        with pytest.raises(RuntimeError, match="worker pod.s. failed"):
            run_k8s(target, "soak", {"url": "http://127.0.0.1:9", **SOAK}, 2, tmp_path,
                    image="img:1", poll_s=0.05, start_delay_s=0)  # fmt: skip
        assert fake.calls("DELETE")[-1].path.startswith("/apis/batch/v1/namespaces/chaos-infer/")
        assert fake.list("batch", "jobs") == []


def test_cli_workers_on_kubernetes(
    engine: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        load_job, "run_k8s", functools.partial(run_k8s, poll_s=0.1, start_delay_s=1.0)
    )
    with FakeK8s() as fake:
        fake.rbac_subject = False  # deploy/rbac.yaml grants namespace chaos-infer, not "loadtest"
        fake.run_pod = _kubelet(tmp_path)
        kubeconfig = fake.write_kubeconfig(tmp_path / "kubeconfig")
        target = write_target(tmp_path / "t.yaml", kubeconfig, url=engine)
        r = CliRunner().invoke(
            main,
            ["load", "soak", "--target", str(target), "--out", str(tmp_path / "out"),
             "--duration", "1.5s", "--rate", "16", "--mix", "short:100",
             "--max-tokens-scale", "0.1", "--workers", "2", "--image", "reg/ci:1",
             "--namespace", "loadtest"],
            catch_exceptions=False,
        )  # fmt: skip
        assert r.exit_code == 0, r.stderr
        (post,) = fake.calls("POST")
        assert post.path == "/apis/batch/v1/namespaces/loadtest/jobs"
        assert post.body["spec"]["template"]["spec"]["containers"][0]["image"] == "reg/ci:1"
    assert json.loads((tmp_path / "out" / "report.json").read_text())["stats"]["requests"] > 5
    # without a target file there is no cluster: one line, exit 2
    r = CliRunner().invoke(
        main, ["load", "soak", "--target", engine, "--out", str(tmp_path / "x"),
               "--rate", "5", "--duration", "1s", "--workers", "2"],
    )  # fmt: skip
    assert r.exit_code == 2 and "give --target TARGET.yaml" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_k8s_target_outside_allowlist_refused_before_any_call(tmp_path: Path) -> None:
    with FakeK8s() as fake:
        kubeconfig = fake.write_kubeconfig(tmp_path / "kubeconfig")
        target = write_target(tmp_path / "t.yaml", kubeconfig, context="prod-1")
        doc = yaml.safe_load(target.read_text())
        assert doc["allow"]["contexts"] == ["kind-*"]
        r = CliRunner().invoke(
            main, ["load", "soak", "--target", str(target), "--out", str(tmp_path / "o"),
                   "--rate", "5", "--duration", "1s", "--workers", "2"],
        )  # fmt: skip
        assert r.exit_code == 2 and "context 'prod-1' is not in the allowlist" in r.stderr
        assert fake.requests == []


@pytest.mark.parametrize(
    "args",
    [
        ["three-phase", "--single-n", "5", "--step-s", "1"],
        ["soak", "--rate", "5", "--duration", "1s"],
        ["soak", "--trace", "TRACE"],
        ["soak", "--rate", "5", "--duration", "1s", "--workers", "2"],
        ["three-phase", "--single-n", "5", "--step-s", "1", "--workers", "2"],
    ],
    ids=["three-phase", "soak", "trace", "soak-workers", "three-phase-workers"],
)
def test_k8s_target_url_outside_the_operator_allowlist_is_refused_before_any_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    """A target file does not allow its own url: ``load ... --target FILE.yaml`` checks it
    against the operator's URL patterns, as the game day does (one line, exit 2, nothing sent,
    no API call, no output folder)."""
    monkeypatch.delenv("CHAOS_INFER_ALLOW", raising=False)
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 8, "output_length": 4}\n')
    args = [str(trace) if a == "TRACE" else a for a in args]
    with FakeK8s() as fake:
        kubeconfig = fake.write_kubeconfig(tmp_path / "kubeconfig")
        target = write_target(tmp_path / "t.yaml", kubeconfig, url="https://llm.example.com/v1")
        out = tmp_path / "o"
        r = CliRunner().invoke(
            main, ["load", args[0], "--target", str(target), "--out", str(out), *args[1:]]
        )
        assert r.exit_code == 2, r.output
        (line,) = r.stderr.strip().splitlines()
        assert line == (
            f"chaos-infer: error: {target}: url https://llm.example.com/v1 is outside the "
            "allowlist (default: loopback only); to reach it, allow it explicitly: --allow "
            "https://llm.example.com:443 (or CHAOS_INFER_ALLOW, or the plan's allow: list)"
        )
        assert fake.requests == [] and not out.exists()
        # the operator's pattern lets it through: the run goes on to its next check (here an
        # --out that is a file, refused before any load)
        monkeypatch.setenv("CHAOS_INFER_ALLOW", "https://llm.example.com:443")
        out.write_text("")
        r = CliRunner().invoke(
            main, ["load", args[0], "--target", str(target), "--out", str(out), *args[1:]]
        )
        assert r.exit_code == 2 and "allowlist" not in r.output and str(out) in r.stderr, r.output
        assert fake.requests == []
