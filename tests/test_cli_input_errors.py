"""New-user review fixes: bad input and an unreachable target give one line and the right exit.

- a plan's unknown top-level (or ``lab:``) key is refused with a "did you mean";
- ``--out`` naming a file or an uncreatable path, and a non-UTF-8 ``--target``/``--plan`` file,
  are one line and exit 2 (gameday, drill run, certify, schedule, load soak/three-phase);
- an unreachable ``--target`` URL is refused before any drill (exit 2, no evidence folder);
- a target that answers but fails every request, or hangs from its first one, is the service's
  failure, not the tool's: the drill runs on past the load warm-up and reads FAILED "the service
  did not meet its SLOs before the fault (nothing ... in N s)", exit 1 (not 2, not 130);
- ``load soak`` with no successful request exits 1 with a line saying so.
"""

from __future__ import annotations

import json
import re
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from labutil import QuietHandler, cli, engine_argv, killed_at_exit, serve_http, wait_for

from chaoslib_infer.errors import ConfigError
from chaoslib_infer.load.records import read_records
from chaoslib_infer.plan import load_plan

ROOT = Path(__file__).resolve().parent.parent
DEAD_URL = "http://127.0.0.1:1"


def _cli(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 60):
    return cli(*args, timeout=timeout, cwd=cwd, env=env)


def _one_line_exit(proc: subprocess.CompletedProcess[str], code: int, fragment: str) -> None:
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and fragment in lines[0], proc.stderr


def _plan(tmp_path: Path, extra: str) -> Path:
    (tmp_path / "e.yaml").write_text("title: t\n", encoding="utf-8")
    plan = tmp_path / "plan.yaml"
    plan.write_text(f"name: p\n{extra}drills:\n  - {{name: a, experiment: e.yaml}}\n")
    return plan


class _Fail500(QuietHandler):
    def _answer(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(n)
        self.send_response(500)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST = _answer


@pytest.fixture()
def failing_server() -> Iterator[str]:
    with serve_http(_Fail500) as url:
        yield url


def test_plan_unknown_keys_are_refused_with_a_close_match(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "stop_condition: {availability_floor: 0.5}\n")
    with pytest.raises(ConfigError, match=r"stop_condition: unknown top-level key \(did you mean "):
        load_plan(plan)
    proc = _cli("gameday", str(plan), "--dry-run", cwd=tmp_path)
    _one_line_exit(proc, 2, "did you mean 'stop_conditions'?")
    with pytest.raises(ConfigError, match=r"lab.replica: unknown field \(did you mean 'replicas'"):
        load_plan(_plan(tmp_path, "lab: {replica: 2}\n"))
    ok = _plan(tmp_path, "description: d\nallow: []\nstop_conditions: {availability_floor: 0.5}\n")
    assert load_plan(ok).name == "p"
    for shipped in (ROOT / "drills").glob("gameday*.yaml"):
        load_plan(shipped)


def test_bad_out_and_non_utf8_files_are_one_line(tmp_path: Path, failing_server: str) -> None:
    (tmp_path / "afile").write_text("x")
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"name: \xff\xfe\n")
    cases = [
        (("gameday", "--out", "afile", "--dry-run"), "exists and is not a folder"),
        (
            ("drill", "run", "oom-kill", "--out", "/proc/x", "--target", failing_server),
            "--out /proc/x",
        ),
        (("certify", "--out", "afile"), "exists and is not a folder"),
        (("gameday", "--out", "", "--dry-run"), "--out '': name a folder"),
        (("drill", "run", "oom-kill", "--out", "", "--target", failing_server), "--out ''"),
        (("certify", "--plan", str(bad), "--out", "c"), "not UTF-8"),
        (("gameday", "--target", str(bad)), "not UTF-8"),
        (("drill", "run", "oom-kill", "--target", str(bad)), "not UTF-8"),
        (("schedule", "--cron", "0 * * * *", "--target", str(bad)), "not UTF-8"),
        (("load", "soak", "--out", "afile", "--target", DEAD_URL, "--rate", "1"), "not a folder"),
        (("load", "three-phase", "--out", "/proc/x", "--target", DEAD_URL), "--out /proc/x"),
    ]
    for args, fragment in cases:
        _one_line_exit(_cli(*args, cwd=tmp_path), 2, fragment)


def test_unreachable_target_is_refused_before_any_drill(tmp_path: Path) -> None:
    proc = _cli(
        "drill", "run", "upstream-timeout", "--target", DEAD_URL, "--out", "d", cwd=tmp_path
    )
    _one_line_exit(proc, 2, f"target {DEAD_URL} unreachable")
    assert not (tmp_path / "d").exists()


def _drill_with_short_warmup(tmp_path: Path, target: str) -> subprocess.CompletedProcess[str]:
    """``drill run upstream-timeout`` against ``target`` with a 1 s load warm-up (the plan
    names the edited experiment: ``drill run`` takes the default plan's drill otherwise)."""
    exp_dir = tmp_path / "experiments"
    exp_dir.mkdir()
    exp = yaml.safe_load((ROOT / "experiments" / "upstream-timeout.yaml").read_text())
    control = next(c for c in exp["controls"] if c["name"] == "background-load")
    control["provider"]["arguments"]["warmup_s"] = 1
    experiment = exp_dir / "upstream-timeout.yaml"
    experiment.write_text(yaml.safe_dump(exp, sort_keys=False))
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        yaml.safe_dump(
            {"name": "p", "drills": [{"name": "upstream-timeout", "experiment": str(experiment)}]}
        )
    )
    return _cli(
        "drill", "run", "upstream-timeout", "--target", target, "--out", "d",
        cwd=tmp_path, env={"CHAOS_INFER_EXPERIMENTS": str(exp_dir), "CHAOS_INFER_PLAN": str(plan)},
        timeout=180,
    )  # fmt: skip


def _failed_before_the_fault(tmp_path: Path, proc: subprocess.CompletedProcess[str]) -> str:
    """The drill read FAILED before the fault, exit 1: its first reason."""
    assert proc.returncode == 1, proc.stdout + proc.stderr
    summary = json.loads((tmp_path / "d" / "summary.json").read_text())
    assert "error" not in summary and "error" not in summary["drills"][0]
    drill = summary["drills"][0]
    assert drill["status"] == "failed"
    first = str(drill["reasons"][0])
    assert first.startswith("the service did not meet its SLOs before the fault (nothing ")
    assert f"reason: {first}" in proc.stdout
    faults = tmp_path / "d" / "upstream-timeout" / "faults.jsonl"
    assert not faults.exists() or not faults.read_text().strip()  # the fault was never injected
    return first


@pytest.mark.slow  # ~30 s: out of the fast tier
def test_a_service_failing_every_request_fails_before_the_fault(
    tmp_path: Path, failing_server: str
) -> None:
    """Every request answered 500: the service answered, wrongly; its drill fails (exit 1), it
    is not the tool's error (2) nor an interruption (130)."""
    first = _failed_before_the_fault(tmp_path, _drill_with_short_warmup(tmp_path, failing_server))
    # the warm-up (1 s) and its patience for a first success (10 s)
    assert re.fullmatch(
        r"the service did not meet its SLOs before the fault \(nothing succeeded in 1[12] s: "
        r"(\d+) requests sent, \1 http_5xx\)",
        first,
    ), first


@pytest.mark.slow  # ~35 s: out of the fast tier
def test_a_service_hung_from_its_first_request_fails_before_the_fault(tmp_path: Path) -> None:
    """A sim engine with the ``hang`` fault armed before the first request: nothing answers in
    the warm-up. The drill runs (its hypothesis before the fault deviates, the fault is never
    injected) and reads FAILED, exit 1: a dead service, not a tool failure."""
    log = (tmp_path / "engine.log").open("w")
    proc = subprocess.Popen(
        engine_argv("dead", tmp_path / "ledger.jsonl", "--load-delay-s", "0"), stderr=log
    )
    with killed_at_exit(proc):
        port = int(
            wait_for(
                lambda: re.search(r"port=(\d+)", (tmp_path / "engine.log").read_text()),
                15,
                "the engine's port",
            ).group(1)
        )
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: _get(url + "/health") == 200, 15, "the engine healthy")
        armed = json.dumps({"mode": "hang"}).encode()
        req = urllib.request.Request(url + "/admin/faults", data=armed, method="POST")
        req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, timeout=3) as resp:
            assert resp.status == 200
        first = _failed_before_the_fault(tmp_path, _drill_with_short_warmup(tmp_path, url))
    found = re.fullmatch(
        r"the service did not meet its SLOs before the fault \(nothing answered in 1[12] s: "
        r"(\d+) requests sent, (\d+) still in flight(, (\d+) timeout_ttft)?\)",
        first,
    )
    assert found, first
    sent, hung, timed_out = int(found[1]), int(found[2]), int(found[4] or 0)
    assert sent == hung + timed_out > 50  # ~8 req/s for 11 s, none answered
    assert "http_" not in first  # no HTTP answer at all
    records = read_records(tmp_path / "d" / "upstream-timeout" / "records.jsonl")
    assert records and not any(r.get("ok") for r in records)


def _get(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            return int(resp.status)
    except OSError:
        return None


def test_soak_with_no_successful_request_exits_1(tmp_path: Path) -> None:
    proc = _cli(
        "load", "soak", "--target", DEAD_URL, "--rate", "4", "--duration", "1s", "--out", "s",
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert f"no request to {DEAD_URL} succeeded" in proc.stderr
    assert "connect" in proc.stderr
