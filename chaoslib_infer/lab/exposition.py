"""The lab's own exposition endpoints for Prometheus: cgroup memory and the load client's view.

One small HTTP server on loopback (a daemon thread of the game-day process) serves two paths:

- ``/metrics/lab``: each replica's memory cgroup, the lab's stand-in for GPU memory, under the
  DCGM exporter's names so the alert table's ``GPUMemoryHigh`` rule watches it unchanged:
  ``DCGM_FI_DEV_FB_USED`` / ``DCGM_FI_DEV_FB_FREE`` (MiB, ``free`` = limit - used) with labels
  ``gpu`` and ``replica`` (the replica's name) and ``stand_in="cgroup-memory"``; beside them
  ``chaos_infer_lab_memory_used_bytes`` / ``chaos_infer_lab_memory_limit_bytes`` and
  ``chaos_infer_lab_oom_kills_total`` (the cgroup's own counters).
- ``/metrics/client``: the load client's counters, read from the attempt records it appends
  (flushed after each attempt) to the current drill's ``records.jsonl``:
  ``chaos_infer_client_requests_total{result="ok"|"failed"}`` (logical requests, counted on
  their final attempt), ``chaos_infer_client_attempts_total{result}`` and the end-to-end latency
  histogram of successful requests, ``chaos_infer_client_e2e_seconds`` (seconds). Counters keep
  counting across drills (:meth:`LabExporter.follow` switches the file), as a process' counters
  would. A request is counted when it ends (its record is written), as a client library's
  counters count it.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from chaoslib_infer.lab.cgroups import MemoryCgroup

__all__ = ["E2E_BUCKETS", "ClientCounters", "LabExporter", "memory_exposition"]

#: Upper bounds (seconds) of the client's latency histogram.
E2E_BUCKETS: tuple[float, ...] = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0)


class ClientCounters:
    """Counters of the load client's records, read incrementally from a growing JSONL file."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._path: Path | None = None
        self._offset = 0
        self.requests = {"ok": 0, "failed": 0}
        self.attempts = {"ok": 0, "failed": 0}
        self.buckets = [0] * len(E2E_BUCKETS)
        self.e2e_sum = 0.0
        self.e2e_count = 0

    def follow(self, path: Path | None) -> None:
        """Count the records appended to ``path`` from now on (its existing lines too);
        ``None`` stops reading. Totals so far are kept."""
        with self._lock:
            self._read()
            self._path, self._offset = path, 0

    def add(self, record: Mapping[str, Any]) -> None:
        """Count one attempt record (``docs/contracts.md`` section 3)."""
        result = "ok" if record.get("ok") else "failed"
        self.attempts[result] += 1
        if record.get("final", True) is False:
            return
        self.requests[result] += 1
        sent, end = record.get("sent_at"), record.get("end_at")
        if result == "ok" and isinstance(sent, int | float) and isinstance(end, int | float):
            e2e = max(0.0, float(end) - float(sent))
            self.e2e_sum += e2e
            self.e2e_count += 1
            for i, bound in enumerate(E2E_BUCKETS):
                if e2e <= bound:
                    self.buckets[i] += 1

    def _read(self) -> None:
        if self._path is None:
            return
        try:
            with self._path.open("rb") as fh:
                fh.seek(self._offset)
                data = fh.read()
        except FileNotFoundError:
            return
        end = data.rfind(b"\n") + 1  # a line still being written waits for the next scrape
        for line in data[:end].splitlines():
            with contextlib.suppress(ValueError):
                rec = json.loads(line)
                if isinstance(rec, dict):
                    self.add(rec)
        self._offset += end

    def exposition(self) -> str:
        """The counters in the Prometheus text format (after reading what was appended)."""
        with self._lock:
            self._read()
            out = [
                "# HELP chaos_infer_client_requests_total Logical requests the load client "
                "finished, by result (failed: timeout, 5xx/429, empty, garbled or cut).",
                "# TYPE chaos_infer_client_requests_total counter",
            ]
            out += [
                f'chaos_infer_client_requests_total{{result="{k}"}} {v}'
                for k, v in self.requests.items()
            ]
            out += [
                "# HELP chaos_infer_client_attempts_total Attempts (retries included) by result.",
                "# TYPE chaos_infer_client_attempts_total counter",
            ]
            out += [
                f'chaos_infer_client_attempts_total{{result="{k}"}} {v}'
                for k, v in self.attempts.items()
            ]
            out += [
                "# HELP chaos_infer_client_e2e_seconds End-to-end latency of successful "
                "requests, seen by the client.",
                "# TYPE chaos_infer_client_e2e_seconds histogram",
            ]
            out += [
                f'chaos_infer_client_e2e_seconds_bucket{{le="{b:g}"}} {n}'
                for b, n in zip(E2E_BUCKETS, self.buckets, strict=True)
            ]
            out.append(f'chaos_infer_client_e2e_seconds_bucket{{le="+Inf"}} {self.e2e_count}')
            out.append(f"chaos_infer_client_e2e_seconds_sum {self.e2e_sum:.6f}")
            out.append(f"chaos_infer_client_e2e_seconds_count {self.e2e_count}")
            return "\n".join(out) + "\n"


def memory_exposition(cgroups: Mapping[str, MemoryCgroup]) -> str:
    """Each replica's cgroup memory in the Prometheus text format (see the module docstring);
    a replica whose cgroup cannot be read is left out of that scrape."""
    rows: dict[str, list[str]] = {
        "DCGM_FI_DEV_FB_USED": [],
        "DCGM_FI_DEV_FB_FREE": [],
        "chaos_infer_lab_memory_used_bytes": [],
        "chaos_infer_lab_memory_limit_bytes": [],
        "chaos_infer_lab_oom_kills_total": [],
    }
    for name, cg in cgroups.items():
        try:
            used, limit, kills = cg.usage_bytes(), cg.limit_bytes(), cg.oom_kills()
        except (OSError, ValueError):
            continue
        labels = f'gpu="{name}",replica="{name}",stand_in="cgroup-memory"'
        rows["chaos_infer_lab_memory_used_bytes"].append(f'{{replica="{name}"}} {used}')
        rows["chaos_infer_lab_oom_kills_total"].append(f'{{replica="{name}"}} {kills}')
        if limit:
            rows["DCGM_FI_DEV_FB_USED"].append(f"{{{labels}}} {used / 2**20:.3f}")
            rows["DCGM_FI_DEV_FB_FREE"].append(f"{{{labels}}} {max(0, limit - used) / 2**20:.3f}")
            rows["chaos_infer_lab_memory_limit_bytes"].append(f'{{replica="{name}"}} {limit}')
    out: list[str] = []
    for metric, lines in rows.items():
        kind = "counter" if metric.endswith("_total") else "gauge"
        out.append(f"# TYPE {metric} {kind}")
        out += [metric + line for line in lines]
    return "\n".join(out) + "\n"


class _QuietServer(ThreadingHTTPServer):
    """No traceback on the game day's terminal for a scrape the scraper abandoned."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        return


class LabExporter:
    """The HTTP server of ``/metrics/lab`` and ``/metrics/client`` on ``127.0.0.1:port``.

    Args:
        cgroups: a callable returning ``{replica name: MemoryCgroup}`` at each scrape (the lab's
            replicas may change: standby replicas, node loss).
        port: the port (0: any free one; :attr:`port` tells which).
    """

    def __init__(self, cgroups: Callable[[], Mapping[str, MemoryCgroup]], port: int = 0) -> None:
        self.client = ClientCounters()
        exporter = self

        class _Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                if self.path == "/metrics/client":
                    body = exporter.client.exposition()
                elif self.path == "/metrics/lab":
                    body = memory_exposition(cgroups())
                else:
                    self.send_error(404)
                    return
                data = body.encode()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain; version=0.0.4")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the scraper gave up (its timeout): its next scrape counts
                    return

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                return

        self._server = _QuietServer(("127.0.0.1", port), _Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="lab-exporter", daemon=True
        )
        self._thread.start()

    @property
    def port(self) -> int:
        """The port it listens on."""
        return int(self._server.server_address[1])

    def follow(self, records: Path | None) -> None:
        """Count the load client's records from ``records`` (a drill's ``records.jsonl``)."""
        self.client.follow(records)

    def close(self) -> None:
        """Stop serving (idempotent)."""
        self._server.shutdown()
        self._server.server_close()
