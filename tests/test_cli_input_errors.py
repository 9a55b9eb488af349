"""New-user review fixes: bad input and an unreachable target give one line and the right exit.

- a plan's unknown top-level (or ``lab:``) key is refused with a "did you mean";
- ``--out`` naming a file or an uncreatable path, and a non-UTF-8 ``--target``/``--plan`` file,
  are one line and exit 2 (gameday, drill run, certify, schedule, load soak/three-phase);
- an unreachable ``--target`` URL is refused before any drill (exit 2, no evidence folder);
- a target that answers but fails every request stops the drill at the load warm-up: the reason
  is on the console and in ``summary.json``, exit 2 (not 130, which is Ctrl-C);
- ``load soak`` with no successful request exits 1 with a line saying so.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from labutil import QuietHandler, cli, serve_http

from chaoslib_infer.errors import ConfigError
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


@pytest.mark.slow  # ~20 s: out of the fast tier
def test_warmup_failure_is_reported_not_exit_130(tmp_path: Path, failing_server: str) -> None:
    exp_dir = tmp_path / "experiments"
    exp_dir.mkdir()
    exp = yaml.safe_load((ROOT / "experiments" / "upstream-timeout.yaml").read_text())
    control = next(c for c in exp["controls"] if c["name"] == "background-load")
    control["provider"]["arguments"]["warmup_s"] = 1
    (exp_dir / "upstream-timeout.yaml").write_text(yaml.safe_dump(exp, sort_keys=False))
    proc = _cli(
        "drill", "run", "upstream-timeout", "--target", failing_server, "--out", "d",
        cwd=tmp_path, env={"CHAOS_INFER_EXPERIMENTS": str(exp_dir)},
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no request to" in proc.stdout and "warm-up" in proc.stdout
    summary = json.loads((tmp_path / "d" / "summary.json").read_text())
    assert "no request to" in summary["error"]
    assert "warm-up" in summary["drills"][0]["error"]


def test_soak_with_no_successful_request_exits_1(tmp_path: Path) -> None:
    proc = _cli(
        "load", "soak", "--target", DEAD_URL, "--rate", "4", "--duration", "1s", "--out", "s",
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert f"no request to {DEAD_URL} succeeded" in proc.stderr
    assert "connect" in proc.stderr
