"""New-user review fixes: target-file checks at load time (kubeconfig/context, url, selector), the
Kubernetes preflight API call before a real run, the load generator stopping when its parent
dies, and ``lab status`` refusing an unreadable fault ledger."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from fake_k8s import FakeK8s, make_cluster, write_target
from labutil import write_k8s_plan

from chaoslib_infer.cli import main as cli_main
from chaoslib_infer.errors import ConfigError
from chaoslib_infer.load.fakeserver import FakeServer
from chaoslib_infer.platforms.kubernetes.target import load_target, main, preflight

ROOT = Path(__file__).resolve().parent.parent


def _one_line_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert out == "" and len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"kubeconfig": "/nonexistent/kubeconfig"}, "/nonexistent/kubeconfig: no such file"),
        ({"kubeconfig": "/nonexistent/kubeconfig", "context": None}, "no such file"),
        ({"context": "kind-gone"}, "'kind-gone' is not in kubeconfig"),
        ({"url": "not-a-url"}, "field 'url'"),
        ({"url": "ftp://h/v1"}, "field 'url'"),
        ({"selector": "app in (vllm"}, "field 'selector'"),
        ({"selector": "app=vllm,,x"}, "field 'selector'"),
    ],
)
def test_bad_kubeconfig_url_selector_refused_at_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fields: dict[str, Any], needle: str
) -> None:
    fake = FakeK8s()  # not started: only its kubeconfig file is needed
    kubeconfig = fake.write_kubeconfig(tmp_path / "kubeconfig")
    fields = {"kubeconfig": str(kubeconfig), **fields}
    path = write_target(tmp_path / "t.yaml", Path(fields.pop("kubeconfig")), **fields)
    assert needle in _one_line_exit_2([str(path)], capsys)


@pytest.mark.parametrize(
    "selector",
    [
        "app=vllm",
        "app==vllm,tier!=canary",
        "app in (vllm, sglang)",
        "!legacy,example.com/x notin (a)",
    ],
)
def test_good_selectors_and_urls_pass(tmp_path: Path, selector: str) -> None:
    kubeconfig = FakeK8s().write_kubeconfig(tmp_path / "kubeconfig")
    path = write_target(
        tmp_path / "t.yaml", kubeconfig, selector=selector, url="https://[::1]:8443/v1/"
    )
    assert load_target(path).selector == selector


def test_preflight_one_cheap_call_and_refusals(tmp_path: Path) -> None:
    with FakeK8s() as fake:
        make_cluster(fake)
        kubeconfig = fake.write_kubeconfig(tmp_path / "kubeconfig")
        target = load_target(write_target(tmp_path / "t.yaml", kubeconfig))
        before = len(fake.requests)
        preflight(target)
        new = fake.requests[before:]
        assert [(r.method, r.path, r.verb, r.resource) for r in new] == [
            ("GET", "/api/v1/namespaces/llm/pods", "list", "pods")
        ]
        fake.forbid("list", "pods")
        with pytest.raises(ConfigError, match="403|forbidden"):
            preflight(target)
    with pytest.raises(ConfigError, match="unreachable"):  # the fake is gone: connection refused
        preflight(target)


def test_drill_run_against_unreachable_api_exits_2_before_load(tmp_path: Path) -> None:
    with FakeK8s() as fake:
        kubeconfig = fake.write_kubeconfig(tmp_path / "kubeconfig")
    target = write_target(tmp_path / "t.yaml", kubeconfig, url="http://127.0.0.1:9/v1")
    plan = write_k8s_plan(tmp_path / "plan.yaml", "simultaneous-restarts")
    out = tmp_path / "out"
    t0 = time.monotonic()
    r = CliRunner().invoke(
        cli_main,
        ["drill", "run", "simultaneous-restarts", "--target", str(target), "--out", str(out)],
        env={"CHAOS_INFER_K8S_PLAN": str(plan), "CHAOS_INFER_ALLOW": None},
        catch_exceptions=False,
    )
    assert r.exit_code == 2, r.stdout + r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "unreachable" in lines[0], r.stderr
    assert "hypothesis" not in r.stdout and not (out / "summary.json").exists()
    assert time.monotonic() - t0 < 5  # refused before the warm-up load


_PARENT = """
import subprocess, sys, time
p = subprocess.Popen([sys.executable, "-m", "chaoslib_infer.load", "--url", sys.argv[1],
    "--rate", "20", "--duration-s", "60", "--max-tokens", "4", "--out", sys.argv[2]],
    start_new_session=True)
print(p.pid, flush=True)
time.sleep(120)
"""


@pytest.mark.serial  # a 2.5 s bound on a 0.2 s watchdog: read 2.6 s beside three test workers
def test_load_generator_stops_when_its_parent_is_killed(tmp_path: Path) -> None:
    records = tmp_path / "records.jsonl"
    with FakeServer() as server:
        parent = subprocess.Popen(
            [sys.executable, "-c", _PARENT, server.url, str(records)],
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not (
                records.exists() and records.stat().st_size > 0
            ):
                time.sleep(0.1)
            assert records.stat().st_size > 0  # it is sending
            parent.send_signal(signal.SIGKILL)
            parent.wait()
            t0 = time.monotonic()
            while time.monotonic() - t0 < 5 and Path(f"/proc/{child}").exists():
                time.sleep(0.05)
            gone_after = time.monotonic() - t0
        finally:
            if Path(f"/proc/{child}").exists():
                os.kill(child, signal.SIGKILL)  # our own child: do not leak it on failure
    assert gone_after < 2.5, f"generator still running {gone_after:.1f} s after its parent died"
    rows = [json.loads(ln) for ln in records.read_text().splitlines()]
    assert rows and all(isinstance(r, dict) for r in rows)


def test_lab_status_refuses_corrupt_ledger(tmp_path: Path) -> None:
    lab = tmp_path / "lab"
    lab.mkdir()
    (lab / "lab.json").write_text("{}")
    (lab / "faults.json").write_text("{broken")
    r = CliRunner().invoke(cli_main, ["lab", "status", "--state-dir", str(lab)])
    assert r.exit_code == 2
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "not valid JSON" in lines[0] and "Traceback" not in r.stderr
    assert "active faults" not in r.stdout
