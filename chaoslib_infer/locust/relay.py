"""Records of a distributed Locust run travel to the master with Locust's own messages.

Imported by ``chaoslib_infer.locust.user`` (so by every locustfile that records); it imports Locust.
Active only when the master runs with ``--chaos-records-via-master`` (the drills' load control
passes it in distributed mode, ``chaoslib_infer.locust.distributed``). Locust copies the master's
custom options to every worker with the test's start (its ``spawn`` message), so the workers need
no option of their own: ``locust -f FILE --worker --master-host HOST`` is enough.

**Worker** (a ``WorkerRunner``, on this machine or another): a recording user's attempts go to an
in-memory outbox instead of a file. Every stats report Locust sends to its master (about every
3 s, ``events.report_to_master``) carries the outbox's records under the key ``chaos_infer``
(with the worker's pid, how many records it has made and sent, and its clock), beside Locust's own
stats. When the worker's users have stopped (``events.test_stop``: the master's ``stop``, or the
worker's own SIGTERM / Ctrl-C, which first stops the users), the rest, attempts cut at the stop
included, goes out at once in a custom message of its own (``runner.send_message``, Locust's
public API), marked ``stopped``, before the worker tells the master it stopped or quit: zmq keeps
the order of one connection, so the last records arrive first.

**Master** (``--master``): every report's records are appended to the run's records file
(``--chaos-records``, same format, ``docs/contracts.md`` section 3) as they arrive
(``events.worker_report``). To make sure the last reports are delivered, the master's quit (its
run-time limit, SIGTERM, Ctrl-C) first stops the test the way Locust's Stop button does: every
worker is sent ``stop``, and the master waits (Locust's own wait: ``--stop-timeout`` + 60 s at
most) until they report no user left, their last records first; then it quits (Locust alone
would send ``quit`` and wait 0.5 s, less than a user takes to finish its stream). The master
keeps a ledger per worker in ``--chaos-workers-file`` (default ``locust_workers.json`` beside the
records file), rewritten atomically when it changes: index, host, pid, records delivered, reports,
the last report's time, whether the last report came, how the worker ended (``stopped``;
``quit`` on its own; ``missing``: Locust stopped hearing its heartbeat, so its attempts after its
last report are lost; ``gone``: left without a last report), and ``workers_lost``.

Limits: a worker's records reach the file up to one report interval after they are made, and
those of a worker killed without warning (SIGKILL, OOM, node loss) since its last report are
lost (the ledger says how many it had delivered and when). Timestamps are the worker's wall
clock: workers on other machines need synchronised clocks (``report_delay_min_s`` in the ledger,
the smallest receive-minus-send time, is negative when a worker's clock is ahead).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import gevent
from locust import events
from locust.runners import (
    STATE_MISSING,
    STATE_RUNNING,
    STATE_SPAWNING,
    MasterRunner,
    WorkerRunner,
)

__all__ = [
    "FLUSH_MESSAGE",
    "REPORT_KEY",
    "WORKERS_FILE",
    "Outbox",
    "lost_workers",
    "records_sink",
    "use_writer",
]

log = logging.getLogger(__name__)

#: The key of a stats report's data dict that carries a worker's records.
REPORT_KEY = "chaos_infer"
#: Custom message with the last records (sent when the worker's users have stopped).
FLUSH_MESSAGE = "chaos_infer_records"
#: The master's ledger of its workers (beside the records file unless --chaos-workers-file).
WORKERS_FILE = "locust_workers.json"
_RECORDS_ENV = "CHAOS_INFER_RECORDS"  # as chaoslib_infer.locust.user reads it
_LEDGER_EVERY_S = 0.5


class Writer(Protocol):
    """What a user writes its records to: ``AppendWriter`` or, on a worker, the ``Outbox``."""

    def write(self, record: dict[str, Any]) -> None: ...


_WRITER: list[Callable[[str], Writer]] = []


def use_writer(open_writer: Callable[[str], Writer]) -> None:
    """Set how records files are opened (``chaoslib_infer.locust.user.records_writer``): by the
    users that write directly, and by the master for what its workers send."""
    _WRITER[:] = [open_writer]


@events.init_command_line_parser.add_listener
def _add_arguments(parser: Any) -> None:
    parser.add_argument(
        "--chaos-records-via-master",
        action="store_true",
        default=False,
        help="distributed run: workers send their chaoslib-infer records to the master with "
        "their stats reports and the master appends them to --chaos-records (set it on the "
        "master; its workers get it with the test)",
    )
    parser.add_argument(
        "--chaos-workers-file",
        default=None,
        help=f"with --chaos-records-via-master: the master's per-worker ledger (JSON; default "
        f"{WORKERS_FILE} beside the records file)",
    )


def _via_master(environment: Any) -> bool:
    return bool(getattr(environment.parsed_options, "chaos_records_via_master", False))


# -- worker ----------------------------------------------------------------------------------


class Outbox:
    """A worker's records on their way to the master (one per process).

    ``write`` keeps a record until the next report takes it (``batch``). Attributes: ``made``
    (records written), ``sent`` (records handed to reports), ``reports``; ``stopped`` once the
    users have stopped and the last report was asked for (its reason: ``"stop"``, the master's;
    ``"quitting"``, the worker's own SIGTERM or Ctrl-C).
    """

    def __init__(self) -> None:
        self.pending: list[dict[str, Any]] = []
        self.made = 0
        self.sent = 0
        self.reports = 0
        self.stopped = False
        self.reason = "stop"

    def write(self, record: dict[str, Any]) -> None:
        """Keep ``record`` for the next report."""
        self.pending.append(record)
        self.made += 1

    def close(self) -> None:
        """Nothing to close (the last report takes what is left)."""

    def batch(self) -> dict[str, Any]:
        """Take every pending record: the ``chaos_infer`` part of a report."""
        records, self.pending = self.pending, []
        self.sent += len(records)
        self.reports += 1
        return {
            "records": records,
            "made": self.made,
            "sent": self.sent,
            "seq": self.reports,
            "stopped": self.stopped,
            "reason": self.reason if self.stopped else None,
            "pid": os.getpid(),
            "time": time.time(),
        }


_OUTBOX: dict[int, Outbox] = {}  # by pid: a forked worker (--processes on a worker) has its own


def records_sink(environment: Any, path: str) -> Writer:
    """Where a recording user of ``environment`` writes: on a worker whose master asked for it
    (``--chaos-records-via-master``), this process's ``Outbox``; else the records file ``path``
    (opened with the writer set by :func:`use_writer`).

    Raises:
        OSError: the records file cannot be opened.
    """
    if isinstance(environment.runner, WorkerRunner) and _via_master(environment):
        box = _OUTBOX.get(os.getpid())
        if box is None:
            box = _OUTBOX[os.getpid()] = Outbox()
            log.info("chaoslib-infer: records go to the master with the stats reports")
        return box
    if not _WRITER:
        raise RuntimeError("chaoslib_infer.locust.relay: use_writer() was not called")
    return _WRITER[0](path)


@events.report_to_master.add_listener
def _on_report_to_master(client_id: str, data: dict[str, Any], **_kw: Any) -> None:
    box = _OUTBOX.get(os.getpid())
    if box is not None:
        data[REPORT_KEY] = box.batch()


@events.test_start.add_listener
def _on_test_start(environment: Any, **_kw: Any) -> None:
    box = _OUTBOX.get(os.getpid())
    if box is not None:  # a new test on the same worker (web UI): a new last report to come
        box.stopped, box.reason = False, "stop"


@events.test_stop.add_listener
def _on_test_stop(environment: Any, **_kw: Any) -> None:
    """The worker's users have stopped: send the rest now, before ``client_stopped`` / ``quit``."""
    runner = environment.runner
    box = _OUTBOX.get(os.getpid())
    if box is None or not isinstance(runner, WorkerRunner):
        return
    box.stopped = True
    try:
        # Locust's public custom-message API (not its private last-report call)
        runner.send_message(FLUSH_MESSAGE, {REPORT_KEY: box.batch()})
    except Exception as exc:  # noqa: BLE001 - an RPC error must not turn into a Locust error
        log.warning("chaoslib-infer: the last records could not be sent to the master: %s", exc)


def _stop_before_quitting(environment: Any, **_kw: Any) -> None:
    """SIGTERM or Ctrl-C on a worker: stop its users first, so that the last report (their last
    records) leaves before Locust's own ``quit`` message (this listener is registered after the
    runner's own, and ``quitting`` calls its listeners in reverse order)."""
    runner = environment.runner
    box = _OUTBOX.get(os.getpid())
    if box is None or not isinstance(runner, WorkerRunner):
        return
    if runner.state in (STATE_SPAWNING, STATE_RUNNING):
        box.reason = "quitting"
        runner.stop()


# -- master ----------------------------------------------------------------------------------


def lost_workers(
    workers: list[dict[str, Any]], stop_requested_at: float | None
) -> list[dict[str, Any]]:
    """The workers of a ledger whose load ended before the stop: ``missing`` (no heartbeat),
    ``gone`` (left without a last report), ``quit`` on their own before the stop was asked for,
    or (at the end) never sent a last report."""
    out = []
    for w in workers:
        ended = w.get("ended")
        early_quit = ended == "quit" and (
            stop_requested_at is None or (w.get("final_at") or 0) < stop_requested_at
        )
        if ended in ("missing", "gone", "no last report") or early_quit:
            out.append(
                {
                    "worker": w["client_id"],
                    "index": w.get("index"),
                    "host": w.get("host"),
                    "pid": w.get("pid"),
                    "reason": ended,
                    "records_delivered": w.get("records", 0),
                    "last_report_at": w.get("last_report_at"),
                    "last_report_delivered": bool(w.get("final")),
                    "found_at": w.get("missing_at") or w.get("final_at") or w.get("gone_at"),
                }
            )
    return out


class _MasterRelay:
    """The master's side: appends what workers send, keeps the ledger, stops before quitting."""

    def __init__(self, environment: Any, runner: MasterRunner) -> None:
        opts = environment.parsed_options
        records = (
            getattr(opts, "chaos_records", None) or os.environ.get(_RECORDS_ENV) or "records.jsonl"
        )
        self.records_path = Path(records).resolve()
        ledger = getattr(opts, "chaos_workers_file", None)
        self.ledger_path = Path(ledger) if ledger else self.records_path.with_name(WORKERS_FILE)
        if not _WRITER:
            raise RuntimeError("chaoslib_infer.locust.relay: use_writer() was not called")
        self.writer = _WRITER[0](str(self.records_path))
        self.runner = runner
        self.expect = int(getattr(opts, "expect_workers", 0) or 0)
        self.workers: dict[str, dict[str, Any]] = {}
        self.written = 0
        self.rejected = 0
        self.stop_requested_at: float | None = None
        self.quitting = False
        self.finished = False
        self.dirty = True
        environment.events.worker_connect.add_listener(self.on_connect)
        environment.events.worker_report.add_listener(self.on_report)
        environment.events.quit.add_listener(lambda **_kw: self.finish())
        runner.register_message(FLUSH_MESSAGE, self.on_flush)
        self._quit = runner.quit
        runner.quit = self.quit  # type: ignore[method-assign]
        self.watcher = gevent.spawn(self.watch)
        self.write_ledger()
        log.info(
            "chaoslib-infer: the workers' records go to %s (ledger %s)",
            self.records_path,
            self.ledger_path,
        )

    def worker(self, client_id: str) -> dict[str, Any]:
        w = self.workers.get(client_id)
        if w is None:
            try:
                index = self.runner.get_worker_index(client_id)
            except Exception:  # noqa: BLE001 - the index is informative
                index = None
            w = self.workers[client_id] = {
                "client_id": client_id,
                "index": index,
                "host": client_id.rsplit("_", 1)[0],
                "pid": None,
                "connected_at": time.time(),
                "reports": 0,
                "records": 0,
                "received": 0,
                "records_rejected": 0,
                "records_made": 0,
                "records_missing": 0,
                "run_ids": [],
                "last_report_at": None,
                "report_delay_min_s": None,
                "final": False,
                "final_at": None,
                "final_reason": None,
                "ended": None,
                "seen": False,
            }
            self.dirty = True
        return w

    def on_connect(self, client_id: str, **_kw: Any) -> None:
        self.worker(client_id)

    def on_report(self, client_id: str, data: dict[str, Any], **_kw: Any) -> None:
        part = data.get(REPORT_KEY) if isinstance(data, dict) else None
        if isinstance(part, dict):
            self.take(client_id, part)

    def on_flush(self, environment: Any = None, msg: Any = None, **_kw: Any) -> None:
        data = getattr(msg, "data", None)
        if isinstance(data, dict) and isinstance(data.get(REPORT_KEY), dict):
            self.take(str(msg.node_id), data[REPORT_KEY])

    def take(self, client_id: str, part: dict[str, Any]) -> None:
        now = time.time()
        w = self.worker(client_id)
        records = part.get("records") or []
        written = 0
        for rec in records:
            try:
                self.writer.write(rec)
            except (ValueError, TypeError, OSError) as exc:
                log.warning("chaoslib-infer: a record from %s was not written: %s", client_id, exc)
                continue
            written += 1
            run_id = str(rec.get("request_id") or "")[:8] if isinstance(rec, dict) else ""
            if run_id and run_id not in w["run_ids"]:
                w["run_ids"].append(run_id)
        self.written += written
        self.rejected += len(records) - written
        w["reports"] += 1
        w["records"] += written  # delivered: in the records file
        w["records_rejected"] += len(records) - written
        w["received"] += len(records)
        w["records_made"] = int(part.get("made") or 0)
        # sent by the worker but never received (a report lost on the way)
        w["records_missing"] = max(int(part.get("sent") or 0) - w["received"], 0)
        w["pid"] = part.get("pid")
        w["last_report_at"] = now
        if isinstance(part.get("time"), int | float):
            delay = round(now - float(part["time"]), 4)
            old = w["report_delay_min_s"]
            w["report_delay_min_s"] = delay if old is None else min(old, delay)
        if part.get("stopped") and not w["final"]:
            w["final"], w["final_at"] = True, now
            w["final_reason"] = part.get("reason")
            w["ended"] = "quit" if part.get("reason") == "quitting" else "stopped"
            if w["ended"] == "quit" and self.stop_requested_at is None:
                log.warning(
                    "chaoslib-infer: Locust worker %s quit during the run (its last %d "
                    "record(s) delivered)",
                    client_id,
                    len(records),
                )
        self.dirty = True

    def watch(self) -> None:
        while not self.finished:
            self.check_clients()
            if self.dirty:
                self.write_ledger()
            gevent.sleep(_LEDGER_EVERY_S)

    def check_clients(self) -> None:
        now = time.time()
        clients = self.runner.clients
        for cid in list(clients):
            node = clients.get(cid)
            if node is None:
                continue
            w = self.worker(cid)
            if not w["seen"]:
                w["seen"], self.dirty = True, True
            if node.state == STATE_MISSING and w["ended"] is None:
                w["ended"], w["missing_at"], self.dirty = "missing", now, True
                log.warning(
                    "chaoslib-infer: Locust worker %s is missing (no heartbeat): %d record(s) "
                    "delivered up to its last report; the attempts it made after it are lost",
                    cid,
                    w["records"],
                )
            elif node.state != STATE_MISSING and w["ended"] == "missing":
                w["ended"], w["healed_at"], self.dirty = None, now, True
        for cid, w in self.workers.items():
            if w["seen"] and cid not in clients and w["ended"] is None and not w["final"]:
                w["ended"], w["gone_at"], self.dirty = "gone", now, True

    def quit(self) -> None:
        """The runner's ``quit``, after a ``stop`` that lets every worker send its last report."""
        if not self.quitting:
            self.quitting = True
            if self.runner.state in (STATE_SPAWNING, STATE_RUNNING):
                self.stop_requested_at = time.time()
                self.dirty = True
                log.info("chaoslib-infer: stopping the workers before quitting (last reports)")
                self.runner.stop()
                # a stopped worker is out of the master's list until it is ready again (after
                # --stop-timeout): tell it to quit now (it reads this after that wait)
                for cid, w in self.workers.items():
                    if w["final"] and w["ended"] == "stopped":
                        with contextlib.suppress(Exception):
                            self.runner.send_message("quit", client_id=cid)
        self._quit()
        self.finish()

    def finish(self) -> None:
        if self.finished:
            return
        self.finished = True
        self.check_clients()
        now = time.time()
        for w in self.workers.values():
            if w["ended"] is None and not w["final"] and w["seen"]:
                w["ended"], w["gone_at"] = "no last report", now
        self.write_ledger(final=True)

    def ledger(self, final: bool = False) -> dict[str, Any]:
        workers = [
            {k: v for k, v in w.items() if k != "seen"}
            for w in sorted(
                self.workers.values(), key=lambda w: (w["index"] is None, w["index"] or 0)
            )
            if w["seen"] or w["reports"]
        ]
        return {
            "transport": "Locust stats reports (events.report_to_master / worker_report), "
            "last report at the worker's stop",
            "records": str(self.records_path),
            "expect_workers": self.expect,
            "connected": len(workers),
            "records_written": self.written,
            "records_rejected": self.rejected,
            "stop_requested_at": self.stop_requested_at,
            "final": final,
            "updated_at": time.time(),
            "workers": workers,
            "workers_lost": lost_workers(workers, self.stop_requested_at),
        }

    def write_ledger(self, final: bool = False) -> None:
        self.dirty = False
        tmp = self.ledger_path.with_name(self.ledger_path.name + ".tmp")
        try:
            tmp.write_text(json.dumps(self.ledger(final), indent=1), encoding="utf-8")
            os.replace(tmp, self.ledger_path)
        except OSError as exc:
            log.warning("chaoslib-infer: cannot write %s: %s", self.ledger_path, exc)


_MASTER: list[_MasterRelay] = []


@events.init.add_listener
def _on_init(environment: Any, runner: Any = None, **_kw: Any) -> None:
    runner = runner if runner is not None else environment.runner
    if isinstance(runner, WorkerRunner):
        environment.events.quitting.add_listener(_stop_before_quitting)
    elif isinstance(runner, MasterRunner) and _via_master(environment):
        _MASTER.append(_MasterRelay(environment, runner))
