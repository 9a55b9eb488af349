"""Command-line safety checks that need no lab: refusals happen before anything starts.

- ``--dry-run`` touches nothing (no output folder, no lab folder, no process);
- a ``--target`` outside the allowlist is refused with one line, exit 2, nothing created;
- a malformed experiment is refused with one line naming the file, exit 2, no traceback, no lab;
- the API key goes to the load generator through the environment and reaches the server as
  ``Authorization: Bearer``, never on the command line or in the records.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from labutil import QuietHandler, cli, serve_http

from chaoslib_infer.load.fakeserver import stream_bytes

ROOT = Path(__file__).resolve().parent.parent
KEY = "sk-fake-0123456789abcdef"


def _cli(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return cli(*args, timeout=timeout, cwd=cwd, env=env)


def _procs_mentioning(fragment: str) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if fragment in cmd:
            out.append(int(entry.name))
    return out


def _one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert lines[0].startswith("chaos-infer: error: ")
    return lines[0]


@pytest.fixture
def plan_dir(tmp_path: Path) -> Path:
    (tmp_path / "plan.yaml").write_text(
        f"name: p\nlab: {{replicas: 1}}\ndrills:\n  - {{name: oom-kill, experiment: "
        f"{ROOT / 'experiments' / 'oom-kill.yaml'}}}\n"
    )
    return tmp_path


@pytest.mark.parametrize("command", ["gameday", "drill"])
def test_dry_run_touches_nothing(plan_dir: Path, command: str) -> None:
    out = plan_dir / "out"
    if command == "gameday":
        args = ["gameday", str(plan_dir / "plan.yaml"), "--out", str(out), "--dry-run"]
    else:
        args = ["drill", "run", "oom-kill", "--out", str(out), "--dry-run"]
    before = sorted(p.name for p in plan_dir.iterdir())
    proc = _cli(*args, cwd=plan_dir)
    assert proc.returncode == 0, proc.stderr
    assert "dry run: nothing was started or changed" in proc.stdout
    assert "oom-kill" in proc.stdout and "rollback: clear-lab-faults" in proc.stdout
    assert sorted(p.name for p in plan_dir.iterdir()) == before  # no out/, no .chaos-infer/
    assert not out.exists()
    assert _procs_mentioning(str(plan_dir)) == []


def test_target_outside_allowlist_is_refused(plan_dir: Path) -> None:
    out = plan_dir / "out"
    env = {"CHAOS_INFER_ALLOW": ""}
    proc = _cli(
        "gameday", str(plan_dir / "plan.yaml"), "--out", str(out), "--target",
        "http://10.11.12.13:8000", cwd=plan_dir, env=env,
    )  # fmt: skip
    assert proc.returncode == 2
    line = _one_error_line(proc)
    assert "http://10.11.12.13:8000 is outside the allowlist" in line
    assert "--allow http://10.11.12.13:8000" in line
    assert not out.exists() and proc.stdout == ""
    # refused in a dry run too, and for drill run
    proc = _cli("drill", "run", "oom-kill", "--target", "https://api.example.com", "--dry-run",
                cwd=plan_dir, env=env)  # fmt: skip
    assert proc.returncode == 2 and "outside the allowlist" in _one_error_line(proc)
    # allowed explicitly (flag, env, plan): the dry run goes ahead
    proc = _cli("gameday", str(plan_dir / "plan.yaml"), "--target", "http://10.11.12.13:8000",
                "--allow", "http://10.0.0.0/8:*", "--dry-run", cwd=plan_dir, env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "target: http://10.11.12.13:8000" in proc.stdout
    proc = _cli("gameday", str(plan_dir / "plan.yaml"), "--target", "http://10.11.12.13:8000",
                "--dry-run", cwd=plan_dir, env={"CHAOS_INFER_ALLOW": "http://10.11.12.13:8000"})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    plan = plan_dir / "plan.yaml"
    plan.write_text(plan.read_text() + "allow: ['http://10.11.12.13:8000']\n")
    proc = _cli("gameday", str(plan), "--target", "http://10.11.12.13:8000", "--dry-run",
                cwd=plan_dir, env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    proc = _cli("gameday", str(plan), "--allow", "10.0.0.1", "--dry-run", cwd=plan_dir)
    assert proc.returncode == 2 and "SCHEME://HOST" in _one_error_line(proc)


@pytest.mark.parametrize(
    "text",
    [
        "title: t\nmethod: [\n",  # YAML syntax error
        "- just\n- a list\n",  # not a mapping
        "title: t\ndescription: d\nmethod:\n  - {type: action, name: x, provider: {type: python, "
        "module: chaoslib_infer.activities.lab, func: no_such_function}}\n",  # unknown function
        "title: t\ndescription: d\nsteady-state-hypothesis: {title: h, probes: [{type: probe, "
        "name: p, provider: {type: python, module: chaoslib_infer.lab.testfault, func: echo}}]}"
        "\nmethod: [{type: action, name: x, provider: {type: python, module: "
        "chaoslib_infer.activities.lab, func: clear_lab_faults}}]\n",  # probe without tolerance
    ],
)
def test_malformed_experiment_one_line_exit_2_nothing_started(tmp_path: Path, text: str) -> None:
    bad = tmp_path / "broken.yaml"
    bad.write_text(text)
    plan = tmp_path / "plan.yaml"
    plan.write_text(f"drills:\n  - {{name: x, experiment: {bad}}}\n")
    out = tmp_path / "out"
    for extra in ([], ["--dry-run"]):
        proc = _cli("gameday", str(plan), "--out", str(out), *extra, cwd=tmp_path)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert str(bad) in _one_error_line(proc)
        assert not out.exists()  # no lab, no fault, no folder


def test_bad_stop_conditions_and_key_file_are_refused(plan_dir: Path) -> None:
    plan = plan_dir / "plan.yaml"
    plan.write_text(plan.read_text() + "stop_conditions: {availability_floor: 3}\n")
    proc = _cli("gameday", str(plan), "--out", str(plan_dir / "o"), cwd=plan_dir)
    assert proc.returncode == 2 and "availability_floor" in _one_error_line(proc)
    plan.write_text(plan.read_text().replace("availability_floor: 3", "availability_floor: 0.5"))
    proc = _cli("gameday", str(plan), "--api-key-file", str(plan_dir / "nope"), "--dry-run",
                cwd=plan_dir)  # fmt: skip
    assert proc.returncode == 2 and "cannot read API key file" in _one_error_line(proc)
    assert not (plan_dir / "o").exists()


@pytest.mark.parametrize("short", ["Q", "Zq9!", "sk-1234"])  # 1, 4 and 7 characters
def test_short_key_in_the_environment_is_refused(plan_dir: Path, short: str) -> None:
    """A key under 8 characters set directly in $CHAOS_INFER_API_KEY is refused as a key file's
    is: one line (without the key), exit 2, before anything starts (dry run or not)."""
    out = plan_dir / "o"
    for extra in (["--dry-run"], []):
        proc = _cli("gameday", str(plan_dir / "plan.yaml"), "--out", str(out), *extra,
                    cwd=plan_dir, env={"CHAOS_INFER_API_KEY": short})  # fmt: skip
        line = _one_error_line(proc)
        assert proc.returncode == 2 and "$CHAOS_INFER_API_KEY" in line and "8 characters" in line
        assert short not in line  # the key itself is not printed
        assert not out.exists()
    proc = _cli("drill", "run", "oom-kill", "--out", str(out), "--dry-run", cwd=plan_dir,
                env={"CHAOS_INFER_API_KEY": short})  # fmt: skip
    assert proc.returncode == 2 and "8 characters" in _one_error_line(proc)
    load = subprocess.run(  # the load generator on its own refuses it too
        [sys.executable, "-m", "chaoslib_infer.load", "--url", "http://127.0.0.1:9",
         "--rate", "1", "--duration-s", "1", "--out", str(plan_dir / "r.jsonl")],  # fmt: skip
        capture_output=True, text=True, timeout=60, cwd=plan_dir,
        env={**os.environ, "CHAOS_INFER_API_KEY": short},
    )  # fmt: skip
    assert load.returncode == 2 and "at least 8 characters" in load.stderr, load.stderr
    # 8 characters is enough; a key file wins over the environment (not checked then)
    proc = _cli("gameday", str(plan_dir / "plan.yaml"), "--out", str(out), "--dry-run",
                cwd=plan_dir, env={"CHAOS_INFER_API_KEY": "sk-12345"})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (plan_dir / "key").write_text(KEY)
    proc = _cli("gameday", str(plan_dir / "plan.yaml"), "--out", str(out), "--dry-run",
                "--api-key-file", str(plan_dir / "key"), cwd=plan_dir,
                env={"CHAOS_INFER_API_KEY": short})  # fmt: skip
    assert proc.returncode == 0, proc.stderr


def test_env_key_unit(monkeypatch: pytest.MonkeyPatch) -> None:
    from chaoslib_infer.safety import redact

    assert redact.env_key({}) is None and redact.env_key({redact.API_KEY_ENV: "  "}) is None
    assert redact.env_key({redact.API_KEY_ENV: " sk-12345 "}) == "sk-12345"
    with pytest.raises(ValueError, match="at least 8 characters") as info:
        redact.env_key({redact.API_KEY_ENV: "sk-1234"})
    assert "sk-1234" not in str(info.value)


def test_rollback_and_report_without_a_run(tmp_path: Path) -> None:
    proc = _cli("rollback", "--state-dir", str(tmp_path / "nolab"), cwd=tmp_path)
    assert proc.returncode == 0 and "nothing to roll back" in proc.stdout
    (tmp_path / "lab").mkdir()
    (tmp_path / "lab" / "faults.json").write_text("{broken")
    (tmp_path / "lab" / "lab.json").write_text("{}")
    proc = _cli("rollback", "--state-dir", str(tmp_path / "lab"), cwd=tmp_path)
    assert proc.returncode == 2 and "not valid JSON" in _one_error_line(proc)
    proc = _cli("report", str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 2 and "no summary.json" in _one_error_line(proc)


# ---- the key reaches the server through the environment only ------------------------------
class _Handler(QuietHandler):
    seen: list[str | None] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server API
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).seen.append(self.headers.get("Authorization"))
        body = b"".join(stream_bytes("chat", tokens=2))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_body(body)


@pytest.fixture
def server() -> Iterator[str]:
    _Handler.seen = []
    with serve_http(_Handler) as url:
        yield url


def test_load_client_sends_key_from_env_not_argv(tmp_path: Path, server: str) -> None:
    out = tmp_path / "records.jsonl"
    argv = [sys.executable, "-m", "chaoslib_infer.load", "--url", server, "--rate", "20",
            "--duration-s", "1", "--out", str(out), "--arrival", "constant"]  # fmt: skip
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "CHAOS_INFER_API_KEY": KEY},
    )
    cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    assert KEY.encode() not in cmdline
    assert _Handler.seen and set(_Handler.seen) == {f"Bearer {KEY}"}
    records = [json.loads(x) for x in out.read_text().splitlines()]
    assert records and all(r["ok"] for r in records)
    assert KEY not in out.read_text() + stdout + stderr
    # without the variable no Authorization header is sent
    _Handler.seen = []
    env = {k: v for k, v in os.environ.items() if k != "CHAOS_INFER_API_KEY"}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert _Handler.seen and set(_Handler.seen) == {None}
