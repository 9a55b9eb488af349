"""A real Prometheus server beside the lab: Debian's ``prometheus`` binary on loopback.

:func:`start` writes ``prometheus.yml`` (scrape and evaluation interval, by default 1 s: stated in
each drill's evidence), the rule files it loads and a TSDB folder under ``<state_dir>/prometheus``,
starts the server on ``127.0.0.1:<free port>`` and waits for ``/-/ready``. Its pid is written to
``<state_dir>/prometheus/prometheus.pid`` so :func:`stop_in` (called by the lab's teardown) stops
it with the lab. Scrape jobs: ``engine`` (each replica's ``/metrics``), ``haproxy`` (HAProxy's
built-in Prometheus exporter), ``lab`` (cgroup memory per replica) and ``client`` (the load
client's counters): see :mod:`chaoslib_infer.lab.exposition`.

``promtool check rules`` vets every rule file first (:func:`check_rules`): a bad file is one
:class:`~chaoslib_infer.errors.ConfigError` line, before any fault.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from chaoslib_infer.errors import ConfigError
from chaoslib_infer.lab.ports import free_port

__all__ = [
    "PID_FILE",
    "PROMETHEUS_DIR",
    "PrometheusServer",
    "check_rules",
    "find_prometheus",
    "render_config",
    "start",
    "stop_in",
]

PROMETHEUS_DIR = "prometheus"
PID_FILE = "prometheus.pid"
_CANDIDATES = ("/usr/bin/prometheus", "/usr/local/bin/prometheus")


@dataclass
class PrometheusServer:
    """A started server.

    Attributes:
        url: its HTTP API base, ``http://127.0.0.1:<port>``.
        pid: its process id.
        work_dir: its folder (config, rules, TSDB, log).
        interval_s: scrape and rule-evaluation interval (seconds).
        rule_files: the rule files it loaded.
        jobs: ``{job: [host:port/path, ...]}`` it scrapes.
    """

    url: str
    pid: int
    work_dir: Path
    interval_s: float
    rule_files: list[Path] = field(default_factory=list)
    jobs: dict[str, list[str]] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 5 s; idempotent."""
        _terminate(self.pid, self.process)
        (self.work_dir / PID_FILE).unlink(missing_ok=True)


def find_prometheus() -> str | None:
    """Path of the ``prometheus`` server binary (Debian package ``prometheus``), or None."""
    for cand in _CANDIDATES:
        if Path(cand).is_file():
            return cand
    return shutil.which("prometheus")


def _promtool() -> str | None:
    return shutil.which("promtool") or (
        "/usr/bin/promtool" if Path("/usr/bin/promtool").is_file() else None
    )


def check_rules(paths: list[Path]) -> None:
    """Check rule files with ``promtool check rules`` (parse errors, bad PromQL, bad ``for:``).

    Raises:
        ConfigError: a file is missing or refused (one line: the file and promtool's first error),
            or promtool is not installed.
    """
    for path in paths:
        if not path.is_file():
            raise ConfigError(f"--rules {path}: no such file")
    tool = _promtool()
    if tool is None:
        raise ConfigError("--rules: promtool is not installed (Debian package prometheus)")
    for path in paths:
        proc = subprocess.run(
            [tool, "check", "rules", str(path)], capture_output=True, text=True, timeout=30
        )
        if proc.returncode != 0:
            lines = [ln.strip() for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
            errors = [ln for ln in lines if "FAILED" not in ln and not ln.startswith("Checking")]
            why = (errors or lines or ["refused"])[0]
            raise ConfigError(f"--rules {path}: promtool check rules: {why}")


def _duration(seconds: float) -> str:
    ms = max(1, round(seconds * 1000))
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def render_config(
    interval_s: float,
    jobs: dict[str, list[str]],
    rule_files: list[Path],
    file_sd: dict[str, tuple[Path, str]] | None = None,
) -> str:
    """``prometheus.yml``: one scrape job per ``jobs`` key, each target ``host:port/path``; and
    one per ``file_sd`` key, ``(targets file, metrics path)``, whose targets file (Prometheus'
    ``file_sd`` JSON, re-read when it changes) the lab rewrites as its replicas move.

    Raises:
        ValueError: a non-positive interval.
    """
    if not interval_s > 0:
        raise ValueError(f"interval must be > 0 s, got {interval_s!r}")
    scrape = []
    for job, targets in jobs.items():
        by_path: dict[str, list[str]] = {}
        for t in targets:
            hostport, _, path = t.partition("/")
            by_path.setdefault("/" + path, []).append(hostport)
        for i, (path, hosts) in enumerate(sorted(by_path.items())):
            scrape.append(
                {
                    "job_name": job if i == 0 else f"{job}-{i}",
                    "metrics_path": path,
                    "scrape_timeout": _duration(min(interval_s, 10.0)),
                    "static_configs": [{"targets": hosts, "labels": {"lab_job": job}}],
                }
            )
    for job, (sd_file, path) in (file_sd or {}).items():
        scrape.append(
            {
                "job_name": job,
                "metrics_path": path,
                "scrape_timeout": _duration(min(interval_s, 10.0)),
                "file_sd_configs": [{"files": [str(sd_file)], "refresh_interval": "5s"}],
            }
        )
    doc = {
        "global": {
            "scrape_interval": _duration(interval_s),
            "evaluation_interval": _duration(interval_s),
        },
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": scrape,
    }
    return yaml.safe_dump(doc, sort_keys=False)


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/-/ready", timeout=1.0) as resp:  # noqa: S310
            return bool(resp.status == 200)
    except OSError:
        return False


def _scraped(url: str) -> bool:
    """Whether every active target has been scraped once (Prometheus applies new targets on a
    5 s tick: the first scrapes come up to 5 s after ``/-/ready``)."""
    try:
        with urllib.request.urlopen(url + "/api/v1/targets", timeout=1.0) as resp:  # noqa: S310
            doc = json.loads(resp.read())
    except (OSError, ValueError):
        return False
    targets = (doc.get("data") or {}).get("activeTargets") or []
    return bool(targets) and all(
        not str(t.get("lastScrape", "")).startswith("0001-") for t in targets
    )


def start(
    state_dir: Path,
    jobs: dict[str, list[str]],
    rule_files: list[Path],
    interval_s: float = 1.0,
    binary: str | None = None,
    ready_timeout_s: float = 20.0,
    wait_scraped: bool = True,
    file_sd: dict[str, tuple[Path, str]] | None = None,
) -> PrometheusServer:
    """Start Prometheus under ``state_dir/prometheus`` and wait until it is ready and has scraped
    every target once (about 5 s: its scrape manager applies targets on a 5 s tick).

    Args:
        state_dir: the lab's state folder (or any folder the server may own).
        jobs: scrape targets, ``{job: ["127.0.0.1:8000/metrics", ...]}``.
        rule_files: rule files to load (checked with :func:`check_rules` first).
        interval_s: scrape and evaluation interval, seconds.
        binary: the server binary (default :func:`find_prometheus`).
        ready_timeout_s: how long to wait for ``/-/ready``.
        wait_scraped: also wait for every target's first scrape (False: return at ``/-/ready``,
            the game day's way: its first drill's warm-up outlasts the 5 s tick).
        file_sd: jobs whose targets a file lists (:func:`render_config`).

    Raises:
        ConfigError: no binary, a refused rule file, or the server not ready in time (its log's
            last line in the message).
    """
    binary = binary or find_prometheus()
    if binary is None:
        raise ConfigError("prometheus is not installed (Debian package prometheus)")
    rule_files = [Path(p).resolve() for p in rule_files]  # the config's folder is not the cwd
    if rule_files:
        check_rules(rule_files)
    work = state_dir / PROMETHEUS_DIR
    stop_in(state_dir)  # a server a killed run left behind
    shutil.rmtree(work / "data", ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    cfg = work / "prometheus.yml"
    cfg.write_text(render_config(interval_s, jobs, rule_files, file_sd), encoding="utf-8")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = (work / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={cfg}",
            f"--storage.tsdb.path={work / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=1d",
            "--web.enable-admin-api",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    (work / PID_FILE).write_text(str(proc.pid), encoding="utf-8")
    server = PrometheusServer(url, proc.pid, work, interval_s, list(rule_files), jobs, proc)
    deadline = time.monotonic() + ready_timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        if _ready(url) and (not wait_scraped or not jobs or _scraped(url)):
            return server
        time.sleep(0.1)
    server.stop()
    text = (work / "prometheus.log").read_text(encoding="utf-8", errors="replace").strip()
    last = text.splitlines()[-1] if text else "no output"
    raise ConfigError(f"prometheus did not become ready in {ready_timeout_s:g} s: {last}")


def _terminate(pid: int, process: subprocess.Popen[bytes] | None = None) -> None:
    for sig, wait_s in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 2.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            break
        if process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=wait_s)
                break
        else:
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline:
                if not _running(pid):
                    return
                time.sleep(0.05)


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, exited but not yet reaped by its parent, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def stop_in(state_dir: Path) -> None:
    """Stop the server whose pid ``state_dir/prometheus/prometheus.pid`` records, when that pid
    still runs ``prometheus`` with this folder's config (the lab's teardown calls this)."""
    pid_file = state_dir / PROMETHEUS_DIR / PID_FILE
    try:
        pid = int(pid_file.read_text(encoding="utf-8").strip())
    except (OSError, ValueError):
        return
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        cmdline = ""
    if str(state_dir / PROMETHEUS_DIR) in cmdline:
        _terminate(pid)
    pid_file.unlink(missing_ok=True)
