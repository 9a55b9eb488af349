"""Ground-truth recorder: a supervisord event listener that writes ``state_dir/events.jsonl``.

Run by supervisord as ``[eventlistener:recorder]`` subscribed to ``PROCESS_STATE``:

- ``PROCESS_STATE_RUNNING`` of a replica   -> ``{"t", "event": "start", "replica", "pid"}``
- first HTTP 200 on the health path after that -> ``{"t", "event": "ready", "replica"}`` (a thread polls
  every replica awaiting readiness every 50 ms)
- ``PROCESS_STATE_EXITED`` / ``STOPPED``   -> ``{"t", "event": "exit", "replica", "pid", "cause",
  "oom_kills", "status", "expected"}`` (``t`` = supervisord's reap time from its log, ms precision)

``cause`` is ``"oom"`` when the replica cgroup's ``oom_kill`` counter rose since the last check,
else the wait status: ``"signal:SIGKILL"`` / ``"exit:N"``. Supervisord's event payload has no exit
status, so it is read from supervisord's own log line (``exited: r0 (terminated by SIGKILL; not
expected)``), which supervisord writes before it delivers the event; ``"killed"`` if not found.
``status`` always holds the raw wait status, so an OOM kill shows ``cause="oom"`` together with
``status="signal:SIGKILL"``.

A second thread samples HAProxy's ``show stat`` (admin socket ``state_dir/haproxy.sock``) every
50 ms and, whenever a server of the ``engines`` backend changes state, writes a snapshot of all
of them: ``{"t", "event": "lb_state", "replica": null, "servers": {"r0": "UP", "r1": "DOWN",
...}}`` (``UP`` includes HAProxy's transitional ``UP 1/2``, ``DOWN`` its ``DOWN 1/2``; ``MAINT``,
``DRAIN``... as HAProxy words them; ``t`` is within one sample of HAProxy's change). Run-time
servers are included: network-jitter's detour ``rN-jitter`` carries ``rN``'s traffic while ``rN``
itself is in maintenance. The first answer after start-up is always written. ``replica`` is null:
the event is about the whole backend, like the node-level fault events.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from chaoslib_infer.lab import haproxy as hap
from chaoslib_infer.lab.cgroups import MemoryCgroup
from chaoslib_infer.lab.netns import replica_host

__all__ = ["Recorder", "append_event", "lb_status", "main", "read_events"]

EVENTS_FILE = "events.jsonl"
SUPERVISORD_LOG = "supervisord.log"
POLL_INTERVAL_S = 0.05
#: HAProxy's admin socket in the state dir (``fleet.HAPROXY_SOCK``; fleet imports this module).
HAPROXY_SOCK = "haproxy.sock"
LB_SAMPLE_S = 0.05

_LOG_LINE = re.compile(
    r"^(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \S+ (?:exited|stopped): (?P<name>\S+) \((?P<msg>.*)\)\s*$"
)


def append_event(path: Path, record: dict[str, Any]) -> None:
    """Append one JSON line atomically (single write with O_APPEND)."""
    data = (json.dumps(record, separators=(",", ":")) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def read_events(path: Path) -> list[dict[str, Any]]:
    """Read events.jsonl (a torn last line is skipped)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    out: list[dict[str, Any]] = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def _log_time(stamp: str) -> float | None:
    """supervisord's ``2024-01-31 12:00:00,123`` (local time) as unix seconds."""
    try:
        base = time.mktime(time.strptime(stamp[:19], "%Y-%m-%d %H:%M:%S"))
        return base + int(stamp[20:23]) / 1000.0
    except (ValueError, OverflowError):
        return None


def lb_status(raw: str) -> str:
    """HAProxy's ``status`` column as one word: ``UP 1/2`` (going down, still served) -> ``UP``,
    ``DOWN 1/2`` (coming up) -> ``DOWN``, ``no check`` -> ``UP``, else the first word."""
    word = raw.strip().split(" ")[0].upper() if raw.strip() else "UNKNOWN"
    return "UP" if raw.strip().lower() == "no check" else word


def wait_status(message: str) -> str:
    """Map supervisord's ``terminated by SIGKILL`` / ``exit status 1`` text to our status form."""
    msg = message.split(";")[0].replace("(core dumped)", "").strip()
    m = re.match(r"terminated by (SIG\w+|\d+)", msg)
    if m:
        return f"signal:{m.group(1)}"
    m = re.match(r"exit status (-?\d+)", msg)
    if m:
        return f"exit:{m.group(1)}"
    return "killed"


class Recorder:
    """State machine behind the event listener; usable without supervisord (tests call it)."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        lab = json.loads((state_dir / "lab.json").read_text())
        self.events_path = state_dir / EVENTS_FILE
        self.health_path = str(lab.get("health_path") or "/health")
        self.log_path = state_dir / SUPERVISORD_LOG
        self.ports: dict[str, int] = {}
        self.cgroups: dict[str, MemoryCgroup] = {}
        for rep in lab["replicas"]:
            self.ports[rep["name"]] = int(rep["port"])
            self.cgroups[rep["name"]] = MemoryCgroup(
                Path(rep["cgroup"]), int(lab["cgroup_version"])
            )
        self.last_oom = {name: cg.oom_kills() for name, cg in self.cgroups.items()}
        self.awaiting_ready: dict[str, bool] = dict.fromkeys(self.ports, False)
        self.log_offset = 0
        self.log_statuses: dict[str, list[tuple[float | None, str]]] = {n: [] for n in self.ports}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.haproxy_sock = state_dir / HAPROXY_SOCK
        self.lb_servers: dict[str, str] | None = None  # last written lb_state snapshot

    # -- events ---------------------------------------------------------------------------
    def emit(self, record: dict[str, Any]) -> None:
        """Append a ground-truth record."""
        append_event(self.events_path, record)

    def _scan_log(self) -> None:
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(self.log_offset)
                data = fh.read()
        except OSError:
            return
        end = data.rfind(b"\n")
        if end < 0:
            return
        self.log_offset += end + 1
        for line in data[: end + 1].decode(errors="replace").splitlines():
            m = _LOG_LINE.match(line)
            if m and m["name"] in self.log_statuses:
                self.log_statuses[m["name"]].append((_log_time(m["ts"]), wait_status(m["msg"])))

    def _rebaseline(self, name: str) -> None:
        """Forget OOM kills that happened while ``name`` was not running (e.g. of a memory hog
        after the engine's own kill): called at start and at ready."""
        value = self.cgroups[name].oom_kills()
        with self.lock:
            self.last_oom[name] = value

    def _exit_status(self, name: str) -> tuple[float | None, str]:
        """(reap time from supervisord's log line or None, wait status) of the latest exit."""
        deadline = time.monotonic() + 0.5
        while True:
            self._scan_log()
            if self.log_statuses[name]:
                return self.log_statuses[name].pop(0)
            if time.monotonic() > deadline:
                return None, "killed"
            time.sleep(0.01)

    def handle(self, eventname: str, payload: str) -> None:
        """Handle one PROCESS_STATE_* notification."""
        fields = dict(kv.split(":", 1) for kv in payload.split("\n", 1)[0].split() if ":" in kv)
        name = fields.get("processname", "")
        if name not in self.ports:
            return
        now = time.time()
        state = eventname.removeprefix("PROCESS_STATE_")
        if state == "RUNNING":
            with self.lock:
                self.awaiting_ready[name] = True
            self._rebaseline(name)
            self.emit({"t": now, "event": "start", "replica": name, "pid": int(fields["pid"])})
        elif state in ("EXITED", "STOPPED"):
            with self.lock:
                self.awaiting_ready[name] = False
            oom_now = self.cgroups[name].oom_kills()
            with self.lock:
                rose = oom_now > self.last_oom[name]
                self.last_oom[name] = oom_now
            reaped_at, status = self._exit_status(name)
            # An OOM kill is always SIGKILL; any other exit is not the OOM killer's doing.
            rose = rose and status in ("signal:SIGKILL", "killed")
            if reaped_at is None or not now - 5.0 < reaped_at <= now:
                reaped_at = now
            record: dict[str, Any] = {
                "t": reaped_at,
                "event": "exit",
                "replica": name,
                "pid": int(fields.get("pid", 0) or 0),
                "cause": "oom" if rose else status,
                "oom_kills": oom_now,
                "status": status,
                "expected": state == "STOPPED" or fields.get("expected") == "1",
            }
            self.emit(record)

    # -- readiness ------------------------------------------------------------------------
    def _healthy(self, port: int, host: str = "127.0.0.1") -> bool:
        conn = http.client.HTTPConnection(host, port, timeout=0.25)
        try:
            conn.request("GET", self.health_path)
            return conn.getresponse().status == 200
        except (OSError, http.client.HTTPException):
            return False
        finally:
            conn.close()

    def poll_once(self) -> None:
        """Check every replica awaiting readiness once; emit ``ready`` on the first 200."""
        with self.lock:
            waiting = [n for n, w in self.awaiting_ready.items() if w]
        for name in waiting:
            # a replica on a lab node listens on its node's address (placement.json)
            if self._healthy(self.ports[name], replica_host(self.state_dir, name)):
                with self.lock:
                    if not self.awaiting_ready[name]:
                        continue
                    self.awaiting_ready[name] = False
                self._rebaseline(name)
                self.emit({"t": time.time(), "event": "ready", "replica": name})

    def poll_forever(self) -> None:
        """Readiness thread body."""
        self._every(POLL_INTERVAL_S, self.poll_once, "poll")

    def _every(self, interval_s: float, once: Callable[[], object], what: str) -> None:
        """Call ``once`` every ``interval_s`` seconds until :attr:`stop` is set; an exception is
        printed as ``recorder: <what> failed: ...`` on stderr and the loop goes on."""
        while not self.stop.wait(interval_s):
            try:
                once()
            except Exception as exc:  # keep going whatever happens
                print(f"recorder: {what} failed: {exc!r}", file=sys.stderr, flush=True)

    # -- load balancer state ---------------------------------------------------------------
    def sample_lb_once(self) -> bool:
        """Read HAProxy's server states once; write an ``lb_state`` snapshot when one changed.

        Returns:
            True when HAProxy answered (False: socket absent or not answering yet/any more).
        """
        try:
            stats = hap.show_stat(self.haproxy_sock)
        except OSError:
            return False
        servers = {name: lb_status(row.get("status", "")) for name, row in stats.items()}
        if servers and servers != self.lb_servers:
            self.lb_servers = servers
            self.emit({"t": time.time(), "event": "lb_state", "replica": None, "servers": servers})
        return True

    def sample_lb_forever(self) -> None:
        """Load-balancer sampling thread body."""
        self._every(LB_SAMPLE_S, self.sample_lb_once, "lb sample")


def _serve(recorder: Recorder, stdin: BinaryIO, stdout: BinaryIO) -> None:
    """supervisord event-listener protocol loop."""
    while True:
        stdout.write(b"READY\n")
        stdout.flush()
        header_line = stdin.readline()
        if not header_line:
            return
        headers = dict(kv.split(":", 1) for kv in header_line.decode().split() if ":" in kv)
        payload = stdin.read(int(headers.get("len", "0"))).decode(errors="replace")
        try:
            recorder.handle(headers.get("eventname", ""), payload)
        except Exception as exc:  # never stall supervisord's event queue
            print(f"recorder: event failed: {exc!r}", file=sys.stderr, flush=True)
        stdout.write(b"RESULT 2\nOK")
        stdout.flush()


def tick_forever(interval_s: float) -> int:
    """Write one byte to stdout every ``interval_s`` so that supervisord's loop wakes up.

    supervisord polls with a 1 s timeout and SIGCHLD does not interrupt the poll (PEP 475), so
    without other I/O it notices a dead child, restarts it and delivers PROCESS_STATE events up
    to 1 s late. Output on a child's pipe wakes the poll; run under supervisord with
    ``stdout_logfile=NONE`` this bounds restart latency to about two ticks.
    """
    out = sys.stdout.buffer
    try:
        while True:
            out.write(b".")
            out.flush()
            time.sleep(interval_s)
    except (BrokenPipeError, KeyboardInterrupt):
        return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``python -m chaoslib_infer.lab.recorder --state-dir DIR``."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m chaoslib_infer.lab.recorder")
    parser.add_argument("--state-dir", type=Path)
    parser.add_argument(
        "--tick-s", type=float, default=None, help="run as supervisord's wake-up ticker instead"
    )
    args = parser.parse_args(argv)
    if args.tick_s is not None:
        return tick_forever(args.tick_s)
    if args.state_dir is None:
        parser.error("--state-dir is required")
    recorder = Recorder(args.state_dir)
    thread = threading.Thread(target=recorder.poll_forever, name="ready-poller", daemon=True)
    thread.start()
    threading.Thread(target=recorder.sample_lb_forever, name="lb-sampler", daemon=True).start()
    try:
        _serve(recorder, sys.stdin.buffer, sys.stdout.buffer)
    finally:
        recorder.stop.set()
    return 0


if __name__ == "__main__":
    sys.exit(main())
