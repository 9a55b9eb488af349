"""Helpers shared by the tests, the lab tests above all (imported as ``from labutil import ...``)."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent

#: The seven drills of the default plan, in its order.
SEVEN_DRILLS = [
    "node-loss",
    "oom-kill",
    "network-jitter",
    "traffic-spike",
    "upstream-timeout",
    "simultaneous-restarts",
    "quota-cut",
]


#: The start of every skip reason that says the lab cannot run here (no HAProxy, no writable
#: memory cgroup, no root or network namespaces): the skips the CI gate turns into failures.
LAB_MISSING = "lab prerequisite missing: "
#: The CI gate: with ``CHAOS_INFER_REQUIRE_LAB=1`` (set by ``scripts/quickstart test``) a test
#: skipped for want of the lab fails (:func:`require_lab`), so a machine without the lab cannot
#: pass the suite by skipping every drill.
REQUIRE_LAB_ENV = "CHAOS_INFER_REQUIRE_LAB"


def lab_skip_reason() -> str | None:
    """Why a lab cannot come up on this machine (no HAProxy, no writable memory cgroup), or
    None when it can: the ``skipif`` of the lab tests (the reason starts with
    :data:`LAB_MISSING`)."""
    from chaoslib_infer.lab.cgroups import CgroupError, detect_hierarchy
    from chaoslib_infer.lab.haproxy import find_haproxy

    if find_haproxy() is None:
        return LAB_MISSING + "haproxy not installed"
    try:
        detect_hierarchy()
    except CgroupError as exc:
        return LAB_MISSING + str(exc)
    return None


def haproxy_missing() -> str | None:
    """:data:`LAB_MISSING` ``haproxy not installed``, or None when HAProxy is here."""
    from chaoslib_infer.lab.haproxy import find_haproxy

    return LAB_MISSING + "haproxy not installed" if find_haproxy() is None else None


@pytest.hookimpl(hookwrapper=True)
def require_lab(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """``pytest_runtest_makereport`` (tests/conftest.py): under ``CHAOS_INFER_REQUIRE_LAB=1`` a
    test skipped with a :data:`LAB_MISSING` reason is reported failed, its reason kept."""
    outcome: Any = yield
    report = outcome.get_result()
    if not report.skipped or os.environ.get(REQUIRE_LAB_ENV) != "1":
        return
    longrepr = report.longrepr
    reason = str(longrepr[2] if isinstance(longrepr, tuple) else longrepr)
    if LAB_MISSING in reason:
        report.outcome = "failed"
        report.longrepr = f"{REQUIRE_LAB_ENV}=1 and this lab test was skipped: {reason}"


def chaos_infer_argv(*args: str) -> list[str]:
    """The command line of ``chaos-infer ARGS`` run by this interpreter."""
    return [sys.executable, "-m", "chaoslib_infer.cli", *args]


def run_module(
    module: str,
    *args: str,
    timeout: float,
    cwd: Path | None = ROOT,
    env: Mapping[str, str] | None = None,
    inherit_env: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m MODULE ARGS`` (this interpreter) as a user would, output captured as text,
    from ``cwd`` (None: this process's). The child's environment is this one with ``env`` on
    top, or, with ``inherit_env=False``, ``env`` alone."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env={**os.environ, **(env or {})} if inherit_env else dict(env or {}),
    )


def cli(
    *args: str,
    timeout: float,
    cwd: Path | None = ROOT,
    env: Mapping[str, str] | None = None,
    inherit_env: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run ``chaos-infer ARGS`` as a user would (:func:`run_module`)."""
    return run_module(
        "chaoslib_infer.cli", *args, timeout=timeout, cwd=cwd, env=env, inherit_env=inherit_env
    )


def drill_run(
    name: str, out: Path, plan: Path, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    """``chaos-infer drill run NAME --out OUT`` with ``plan`` as the plan (``$CHAOS_INFER_PLAN``)."""
    return cli(
        "drill",
        "run",
        name,
        "--out",
        str(out),
        timeout=timeout,
        env={"CHAOS_INFER_PLAN": str(plan)},
    )


def write_plan(tmp: Path, plan: dict[str, Any], file: str = "gameday.yaml") -> Path:
    """Write ``plan`` to ``tmp/drills/FILE``, with ``tmp/experiments`` linked to the checkout's
    experiments (``drill run`` looks experiments up next to the plan's folder); return its path."""
    (tmp / "drills").mkdir(parents=True, exist_ok=True)
    if not (tmp / "experiments").exists():
        (tmp / "experiments").symlink_to(ROOT / "experiments")
    path = tmp / "drills" / file
    path.write_text(yaml.safe_dump(plan))
    return path


def write_k8s_plan(path: Path, drill: str, drill_vars: dict[str, Any] | None = None) -> Path:
    """Write a Kubernetes plan (``platform: kubernetes``, name ``k8s-test``) of one drill,
    ``experiments/k8s/DRILL.yaml``, with ``drill_vars`` as its ``vars`` when given, to ``path``;
    return ``path``."""
    entry: dict[str, Any] = {
        "name": drill,
        "experiment": str(ROOT / "experiments" / "k8s" / f"{drill}.yaml"),
    }
    if drill_vars is not None:
        entry["vars"] = drill_vars
    plan = {"name": "k8s-test", "platform": "kubernetes", "drills": [entry]}
    path.write_text(yaml.safe_dump(plan))
    return path


def background_load_control(**arguments: Any) -> dict[str, Any]:
    """An experiment's ``background-load`` control (:mod:`chaoslib_infer.controls.load`) with
    ``arguments``."""
    return {
        "name": "background-load",
        "provider": {
            "type": "python",
            "module": "chaoslib_infer.controls.load",
            "arguments": arguments,
        },
    }


def put_hpa(fake: Any, spec: dict[str, Any]) -> None:
    """Put a HorizontalPodAutoscaler ``llm/vllm`` (``autoscaling/v2``) with ``spec`` in the fake
    Kubernetes API ``fake`` (a :class:`fake_k8s.FakeK8s`)."""
    fake.put(
        "autoscaling",
        "horizontalpodautoscalers",
        {
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "vllm", "namespace": "llm"},
            "spec": spec,
        },
    )


def echo_key_probe(pause_after_s: float) -> dict[str, Any]:
    """An experiment probe ``echo-key`` that hands ``${infer_api_key}`` to Chaos Toolkit (which
    journals and logs activity outputs), then pauses ``pause_after_s``."""
    return {
        "type": "probe",
        "name": "echo-key",
        "provider": {
            "type": "python",
            "module": "chaoslib_infer.lab.testfault",
            "func": "echo",
            "arguments": {"value": "${infer_api_key}"},
        },
        "pauses": {"after": pause_after_s},
    }


def jsonl(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines file, one a non-blank line."""
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def lab_events(lab_dir: Path) -> list[dict[str, Any]]:
    """A lab's events (its ``events.jsonl``)."""
    return jsonl(lab_dir / "events.jsonl")


def lab_pids(lab_dir: Path) -> list[int]:
    """The pids a lab's ``events.jsonl`` names, in its order."""
    return [int(e["pid"]) for e in lab_events(lab_dir) if e.get("pid")]


def pid_alive(pid: int, marker: str | None = None) -> bool:
    """True if ``pid`` is a live process (zombies and dead processes count as gone) and, with
    ``marker``, its command line contains it (a pid the kernel reused for another process since
    is not ours)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = "" if marker is None else Path(f"/proc/{pid}/cmdline").read_bytes().decode()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X") and (
        marker is None or marker in cmdline.replace("\0", " ")
    )


def alive_pids(pids: Iterable[int]) -> list[int]:
    """The pids of ``pids`` that are still live processes (see :func:`pid_alive`)."""
    return [pid for pid in pids if pid_alive(pid)]


def check_verdict(drill: dict[str, Any], allowed: tuple[str, ...] = ("passed", "failed")) -> None:
    """A drill's verdict agrees with its own criteria rows and reasons.

    ``failed`` has reasons, and every failing row is named in one (``(criterion)``), unless the
    reason is a defect before the fault or a fault left behind (they stand alone); ``passed`` has no reason and no failing row.
    """
    status = drill["status"]
    assert status in allowed, (status, drill.get("reasons"))
    failing = [r for r in drill["verdict"]["rows"] if r["result"] == "fail"]
    reasons = drill["reasons"]
    if status == "passed":
        assert not failing and not reasons, (failing, reasons)
    elif status == "failed":
        assert reasons
        own = ("the service did not meet its SLOs before the fault", "fault left behind")
        if not reasons[0].startswith(own):
            for row in failing:
                assert any(f"({row['criterion']})" in r for r in reasons), (row, reasons)


def run_gameday(
    plan: Path | None, out: Path, timeout_s: float = 600.0, shipped: bool = False
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """Run ``chaos-infer gameday [PLAN] --out OUT`` as a user would (a child process from the
    repository root, this environment; no PLAN: the default plan); return the process and
    ``summary.json``. ``shipped``: without the suite's short warm-up
    (``CHAOS_INFER_LOAD_WARMUP_S``, conftest.py), the experiments' own ``auto``.

    Raises:
        AssertionError: no summary was written (with the output's tail).
    """
    plan_arg = [] if plan is None else [str(plan)]
    env = dict(os.environ)
    if shipped:
        env.pop("CHAOS_INFER_LOAD_WARMUP_S", None)
    proc = subprocess.run(
        [sys.executable, "-m", "chaoslib_infer.cli", "gameday", *plan_arg, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=ROOT,
        env=env,
    )
    summary_file = out / "summary.json"
    assert summary_file.is_file(), proc.stdout[-3000:] + proc.stderr[-2000:]
    summary: dict[str, Any] = json.loads(summary_file.read_text())
    return proc, summary


def plan_copy(base: Path, edit: Callable[[str, dict[str, Any]], None]) -> dict[str, str]:
    """Copy the default plan (``drills/gameday.yaml``) and its experiments into ``base``, each
    experiment changed in place by ``edit(drill_name, experiment)``; return the environment
    (``CHAOS_INFER_PLAN``, ``CHAOS_INFER_EXPERIMENTS``) that makes ``chaos-infer drill run`` and
    ``gameday`` use the copies."""
    exp_dir = base / "experiments"
    exp_dir.mkdir(parents=True)
    plan = yaml.safe_load((ROOT / "drills" / "gameday.yaml").read_text())
    for drill in plan["drills"]:
        name = drill["name"]
        exp = yaml.safe_load((ROOT / "experiments" / f"{name}.yaml").read_text())
        edit(name, exp)
        (exp_dir / f"{name}.yaml").write_text(yaml.safe_dump(exp, sort_keys=False))
        drill["experiment"] = str(exp_dir / f"{name}.yaml")
    (base / "gameday.yaml").write_text(yaml.safe_dump(plan, sort_keys=False))
    return {"CHAOS_INFER_PLAN": str(base / "gameday.yaml"), "CHAOS_INFER_EXPERIMENTS": str(exp_dir)}


@dataclass(frozen=True)
class GamedayRun:
    """One finished ``chaos-infer gameday`` run: the process, its ``--out`` folder, its wall time
    (seconds) and ``summary.json``; :meth:`drill` is one drill's entry by name."""

    proc: subprocess.CompletedProcess[str]
    out: Path
    elapsed_s: float
    summary: dict[str, Any]

    def drill(self, name: str) -> dict[str, Any]:
        """The summary entry of drill ``name``. Raises KeyError when the run has no such drill."""
        for d in self.summary["drills"]:
            if d["name"] == name:
                return dict(d)
        raise KeyError(name)


def run_default_gameday(out: Path, timeout_s: float = 900.0) -> GamedayRun:
    """Run the README's main job (``chaos-infer gameday --out OUT``: the default plan on the
    default lab) as a user would; return the run. The suite runs it once (the session fixture
    ``default_gameday`` in conftest.py) and every test that only reads a drill's outcome of the
    default plan reads it there instead of bringing up a lab of its own."""
    t0 = time.monotonic()
    proc, summary = run_gameday(None, out, timeout_s, shipped=True)
    return GamedayRun(proc, out, time.monotonic() - t0, summary)


#: every wait of the suite is stretched by this factor (``CHAOS_INFER_TEST_WAIT_SLACK``, default
#: 3): a wait bounds a poll, it is no claim about speed; a 2-core CI machine running three labs at
#: once answered an OOM kill's restart in over 10 s where a quiet one takes 2
WAIT_SLACK = float(os.environ.get("CHAOS_INFER_TEST_WAIT_SLACK") or 3.0)


def wait_for(pred: Callable[[], Any], timeout_s: float, what: str, poll_s: float = 0.02) -> Any:
    """Poll ``pred`` every ``poll_s`` until it returns something true; return that.

    Raises:
        AssertionError: not within ``timeout_s`` x :data:`WAIT_SLACK` (naming ``what``).
    """
    timeout_s *= WAIT_SLACK
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def engine_argv(replica: str, ledger: Path, *args: str) -> list[str]:
    """The command line of a lab engine (``chaoslib_infer.lab.engine``) on 127.0.0.1, port 0 (it
    prints the port it got), replica ``replica``, ledger ``ledger``, then ``args``."""
    return [
        sys.executable, "-m", "chaoslib_infer.lab.engine", "--host", "127.0.0.1", "--port", "0",
        "--replica-id", replica, "--ledger", str(ledger), *args,
    ]  # fmt: skip


def read_until(proc: subprocess.Popen[str], marker: str, timeout_s: float) -> str:
    """Read ``proc``'s stdout line by line up to the first line holding ``marker`` (or to its
    end, or until ``timeout_s`` have passed); return all that was read."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    seen = ""
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        seen += line
        if marker in line or not line:
            break
    return seen


@contextlib.contextmanager
def killed_at_exit(proc: subprocess.Popen[str]) -> Iterator[subprocess.Popen[str]]:
    """``with killed_at_exit(proc):`` whatever happens in the block, ``proc`` does not outlive it
    (killed and reaped if still running)."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def free_port() -> int:
    """A loopback TCP port nothing listens on (bound, then closed again)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port: int = s.getsockname()[1]
    s.close()
    return port


class QuietHandler(http.server.BaseHTTPRequestHandler):
    """A request handler that logs nothing (the test servers' base)."""

    def log_message(self, *args: object) -> None:
        return

    def send_body(self, body: bytes) -> None:
        """The ``Content-Length`` header, the end of the headers, then ``body``."""
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@contextlib.contextmanager
def serve_http(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """A threaded HTTP server on a free loopback port answering with ``handler``; yields its base
    URL and shuts it down after."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def write_locustfile(tmp_path: Path) -> Path:
    """A locustfile in ``tmp_path``: one :class:`LLMStreamUser` at 10 requests/s, 4 tokens."""
    lf = tmp_path / "lf.py"
    lf.write_text(
        textwrap.dedent("""
        from locust import constant_throughput
        from chaoslib_infer.locust.user import LLMStreamUser

        class Chat(LLMStreamUser):
            wait_time = constant_throughput(10)
            max_tokens = 4
        """)
    )
    return lf


class BackgroundRun:
    """A subprocess (stdout and stderr merged, from the repository root) whose output a thread
    reads into ``lines`` (so it never blocks); :meth:`on_line` sees each line as it comes."""

    def __init__(self, argv: list[str], env: Mapping[str, str], **popen: Any) -> None:
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
            env=env,
            **popen,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def on_line(self, line: str) -> None:
        """Called by the reader thread with each line, after it is added to ``lines``."""

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            self.on_line(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait(self, timeout: float) -> int:
        """The exit code; the test fails (the process killed, :meth:`kill`) after ``timeout``."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"the runner did not exit within {timeout:g} s:\n{self.output[-4000:]}")
        self._reader.join(timeout=5)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
