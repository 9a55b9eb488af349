"""Replica caps, standby replicas and the lab's scale-out policy.

Standby replicas (``Lab.up(..., standby=N)``) are configured but not started: a supervisord program
with ``autostart=false`` and an HAProxy server declared ``disabled`` (maintenance). They are listed in
``lab.json`` with ``"standby": true`` and are left out of ``Lab.replica_names()`` (the lab's initial,
serving size), so readiness checks ignore them while the recorder still writes their
start / ready / exit events.

The scale-out policy (``Lab.up(..., autoscale=True)``) is the supervisord program ``autoscaler``
(``python -m chaoslib_infer.lab.scaling --state-dir DIR``). Every ``sample_s`` (0.25 s) it reads the
queue depth: HAProxy's backend ``qcur`` plus every running engine's ``vllm:num_requests_waiting``
(``/metrics``). When the depth stays above ``scale_out_queue`` for ``scale_out_after_s`` seconds, and
``scale_out_cooldown_s`` has passed since the last scale-out, it starts one standby replica (which
pays its cold start: weight-load delay, then warm-up), enables it in HAProxy once its health
endpoint answers 200, and waits for the first request it serves. It never grows the serving fleet
beyond an active replica cap (a ``quota-cut`` fault). Ground truth, appended to ``events.jsonl``::

    {"t", "event": "scale_out_triggered", "replica", "queue_depth", "haproxy_qcur",
     "engines_waiting", "above_since", "threshold"}
    {"t", "event": "scale_out_ready", "replica"}       health endpoint 200 after the start
    {"t", "event": "scale_out_enabled", "replica"}     HAProxy server out of maintenance
    {"t", "event": "scale_out_serving", "replica", "recorded_at"}
        t = first request the replica served after the trigger (engine ledger / HAProxy log,
        see ``Lab.served``); recorded_at = when the autoscaler wrote the line.

Queue-depth samples go to ``state_dir/queue-depth.jsonl`` (``{"t", "depth", "haproxy_qcur",
"engines_waiting"}``, one line per sample).

Each scale-out is put in the lab's fault ledger (``kind: scale-out``, this module) before the standby
starts, so any drill's ``clear-lab-faults`` rollback (and ``Lab.down``) returns the lab to its initial
size. The ``quota-cut`` fault (a replica cap) and the ``traffic-spike`` fault are undone here too:
see :func:`undo_fault` / :func:`fault_active`.

Layout: this module holds the quota-cut cap, the undo of every scaling fault (fault records name
it) and the autoscaler program; :mod:`chaoslib_infer.lab.standby` holds ``Lab.up``'s scaling
options and configuration pieces and :mod:`chaoslib_infer.lab.replicas` the start / stop /
serving primitives; their public names are re-exported here.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chaoslib_infer.lab.fleet import Lab
from chaoslib_infer.lab.recorder import EVENTS_FILE, append_event
from chaoslib_infer.lab.replicas import (
    BACKEND,
    all_names,
    back_in_standby,
    backend_rows,
    haproxy_command,
    in_maintenance,
    max_concurrency_per_instance,
    process_infos,
    queue_depth,
    serving_replicas,
    standby_names,
    start_replica,
    stop_replica,
)
from chaoslib_infer.lab.standby import (
    QUEUE_SAMPLES,
    SAMPLE_S,
    mark_standby_servers,
    scaling_options,
    supervisor_program,
)
from chaoslib_infer.lab.statedir import LabError

__all__ = [
    "HOLD_FILE",
    "MODULE",
    "QUEUE_SAMPLES",
    "ScaleOutPolicy",
    "Autoscaler",
    "cap_replicas",
    "fault_active",
    "main",
    "mark_standby_servers",
    "max_concurrency_per_instance",
    "queue_depth",
    "replica_cap",
    "scaling_held",
    "restore_replicas",
    "scaling_options",
    "serving_replicas",
    "standby_names",
    "start_replica",
    "stop_replica",
    "supervisor_program",
    "undo_fault",
]

#: ``module`` of every fault record this file owns (the lab imports it for undo).
MODULE = "chaoslib_infer.lab.scaling"
#: While this file names a future ``until`` (unix s), the autoscaler starts nothing: written by
#: :func:`undo_fault` while it restores or stops replicas, whose fault record the lab has already
#: taken out of the ledger (so a cap being lifted cannot be mistaken for spare room).
HOLD_FILE = "scaling-hold.json"


# --------------------------------------------------------------------------------------------
# Replica cap (quota cut)
# --------------------------------------------------------------------------------------------
def replica_cap(lab: Lab) -> int | None:
    """The active replica cap: the lowest ``quota`` of the ``quota-cut`` faults in the lab's fault
    ledger, or None when there is none."""
    try:
        faults = json.loads((lab.state_dir / "faults.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    quotas = [int(f["quota"]) for f in faults if f.get("kind") == "quota-cut" and "quota" in f]
    return min(quotas) if quotas else None


def cap_replicas(lab: Lab, quota: int, drain_timeout_s: float = 5.0, **info: Any) -> dict[str, Any]:
    """Lower the number of serving replicas to ``quota``: the replicas beyond it are put in HAProxy
    maintenance, drained and stopped through supervisord. The cap is recorded in the lab's fault
    ledger *before* anything changes (kind ``quota-cut``); :func:`undo_fault` restores every stopped
    replica (start, health, enable). The autoscaler respects the cap while it is recorded.

    Args:
        lab: the lab.
        quota: replicas allowed (>= 1).
        drain_timeout_s: per-replica drain bound in seconds (see :func:`stop_replica`).
        **info: JSON-able extras stored in the fault record (e.g. the capacity plan).

    Returns:
        ``{"fault_id", "quota", "kept", "stopped", "cut_at", "cut_done_at", "stops": [...]}``
        (unix s); ``stopped`` is empty when ``quota`` is not below the serving count.

    Raises:
        LabError: quota < 1, a cap already active, or supervisord/HAProxy errors.
    """
    if isinstance(quota, bool) or not isinstance(quota, int) or quota < 1:
        raise LabError(f"quota must be an integer >= 1, got {quota!r}")
    if replica_cap(lab) is not None:
        raise LabError("a quota-cut is already active in this lab; clear it first")
    serving = serving_replicas(lab)
    kept, stopped = serving[:quota], serving[quota:]
    cut_at = time.time()
    fault_id = lab.add_fault(
        {
            "kind": "quota-cut",
            "module": MODULE,
            "replica": None,
            "quota": quota,
            "kept": kept,
            "stopped": stopped,
            "serving_before": serving,
            **info,
        }
    )
    for name in stopped:  # no new requests to any of them first, then drain and stop each
        haproxy_command(lab, f"set server {BACKEND}/{name} state maint")
    stops = [stop_replica(lab, name, drain_timeout_s) for name in stopped]
    return {
        "fault_id": fault_id,
        "quota": quota,
        "kept": kept,
        "stopped": stopped,
        "serving_before": serving,
        "cut_at": cut_at,
        "cut_done_at": time.time(),
        "stops": stops,
    }


def restore_replicas(lab: Lab, names: list[str], timeout_s: float = 30.0) -> list[dict[str, Any]]:
    """Start and enable every replica of ``names`` that is not serving (in parallel).

    Returns:
        One :func:`start_replica` result per replica that had to be restored.

    Raises:
        LabError: a replica did not come back within ``timeout_s``.
    """
    infos = process_infos(lab)
    rows = backend_rows(lab)
    todo = [
        n
        for n in names
        if infos.get(n, {}).get("statename") != "RUNNING" or in_maintenance(rows.get(n))
    ]
    if not todo:
        return []
    with ThreadPoolExecutor(max_workers=len(todo)) as pool:
        return list(pool.map(lambda n: start_replica(lab, n, timeout_s), todo))


# --------------------------------------------------------------------------------------------
# Fault ledger hooks (called by Lab.clear_faults / remove_fault / status)
# --------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _hold(lab: Lab, reason: str, max_s: float = 60.0) -> Iterator[None]:
    path = lab.state_dir / HOLD_FILE
    path.write_text(json.dumps({"until": time.time() + max_s, "reason": reason}))
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            path.unlink()


def scaling_held(lab: Lab) -> bool:
    """True while an undo holds the autoscaler (see :data:`HOLD_FILE`)."""
    try:
        hold = json.loads((lab.state_dir / HOLD_FILE).read_text())
        return time.time() < float(hold["until"])
    except (OSError, ValueError, KeyError, TypeError):
        return False


def undo_fault(lab: Lab, record: dict[str, Any]) -> str | None:
    """Undo a fault this module recorded (idempotent); the autoscaler is held meanwhile.

    - ``quota-cut``: start and enable every replica it stopped.
    - ``scale-out``: put the scaled-out replica back in standby (maintenance, drain, stop).
    - ``traffic-spike``: return the lab to its initial size (every standby replica back in standby).

    Returns:
        What was done, or None when nothing was left to undo.

    Raises:
        LabError: a replica could not be restored or stopped.
    """
    if not lab.supervisord_alive():
        return None
    with _hold(lab, f"undo {record.get('kind')} {record.get('id')}"):
        return _undo(lab, record)


def _undo(lab: Lab, record: dict[str, Any]) -> str | None:
    kind = record.get("kind")
    if kind == "quota-cut":
        done = restore_replicas(lab, list(record.get("stopped") or []))
        if not done:
            return None
        restored = ", ".join(d["replica"] for d in done)
        return (
            f"quota-cut to {record.get('quota')}: restored {restored} (started, healthy, enabled)"
        )
    names = [str(record["replica"])] if kind == "scale-out" else standby_names(lab)
    infos = process_infos(lab)
    rows = backend_rows(lab)
    todo = [n for n in names if not back_in_standby(lab, n, infos, rows)]
    for name in todo:
        stop_replica(lab, name, drain_timeout_s=5.0)
    if not todo:
        return None
    return f"{kind}: {', '.join(todo)} back in standby (maintenance, stopped)"


def fault_active(lab: Lab, record: dict[str, Any]) -> bool:
    """True while the recorded fault still changes the lab (see :func:`undo_fault`)."""
    if not lab.supervisord_alive():
        return False
    infos = process_infos(lab)
    rows = backend_rows(lab)
    kind = record.get("kind")
    if kind == "quota-cut":
        return any(
            infos.get(n, {}).get("statename") != "RUNNING" or in_maintenance(rows.get(n))
            for n in record.get("stopped") or []
        )
    if kind == "scale-out":
        return not back_in_standby(lab, str(record["replica"]), infos, rows)
    if kind == "traffic-spike" and time.time() < float(record.get("spike_end_at") or 0.0):
        return True
    return any(not back_in_standby(lab, n, infos, rows) for n in standby_names(lab))


# --------------------------------------------------------------------------------------------
# The scale-out policy
# --------------------------------------------------------------------------------------------
@dataclass
class ScaleOutPolicy:
    """Decide when to scale out from queue-depth samples (pure: no I/O; times in seconds).

    Attributes:
        threshold: depth (requests) above which the service counts as overloaded.
        after_s: how long the depth must stay above ``threshold`` without a break.
        cooldown_s: minimum time between two scale-outs (from trigger to trigger).
    """

    threshold: float
    after_s: float
    cooldown_s: float
    above_since: float | None = None
    last_fired: float | None = None

    def observe(self, t: float, depth: float) -> bool:
        """Feed one sample; True when a scale-out is due now (call :meth:`fired` if one starts)."""
        if depth > self.threshold:
            if self.above_since is None:
                self.above_since = t
        else:
            self.above_since = None
        if self.above_since is None or t - self.above_since < self.after_s:
            return False
        return self.last_fired is None or t - self.last_fired >= self.cooldown_s

    def fired(self, t: float) -> None:
        """A scale-out started at ``t``: start the cooldown and require a new overload period."""
        self.last_fired = t
        self.above_since = None


class Autoscaler:
    """The ``autoscaler`` program: sample the queue depth, apply :class:`ScaleOutPolicy`, bring up
    standby replicas (one at a time) and record the ground truth (see the module docstring)."""

    def __init__(self, lab: Lab) -> None:
        """Args: lab: the lab whose ``lab.json["scaling"]`` holds the policy options."""
        opts = lab.meta.get("scaling") or {}
        self.lab = lab
        self.policy = ScaleOutPolicy(
            float(opts.get("scale_out_queue", 4.0)),
            float(opts.get("scale_out_after_s", 1.0)),
            float(opts.get("scale_out_cooldown_s", 10.0)),
        )
        self.sample_s = float(opts.get("sample_s", SAMPLE_S))
        self.events = lab.state_dir / EVENTS_FILE
        self.samples = lab.state_dir / QUEUE_SAMPLES
        self.busy: threading.Thread | None = None

    def _emit(self, record: dict[str, Any]) -> None:
        append_event(self.events, record)

    def _candidate(self) -> str | None:
        """A standby replica that is stopped and in maintenance, unless the cap or a hold
        forbids growing."""
        if scaling_held(self.lab):
            return None
        infos = process_infos(self.lab)
        rows = backend_rows(self.lab)
        serving = [
            n
            for n in all_names(self.lab)
            if infos.get(n, {}).get("statename") == "RUNNING" and not in_maintenance(rows.get(n))
        ]
        cap = replica_cap(self.lab)
        if cap is not None and len(serving) >= cap:
            return None
        for name in standby_names(self.lab):
            if back_in_standby(self.lab, name, infos, rows):
                return name
        return None

    def _fault_recorded(self, fault_id: str) -> bool:
        try:
            faults = json.loads((self.lab.state_dir / "faults.json").read_text())
        except (OSError, json.JSONDecodeError):
            return False
        return any(f.get("id") == fault_id for f in faults)

    def _bring_up(
        self, name: str, sample: dict[str, Any], triggered_at: float, above_since: float | None
    ) -> None:
        lab = self.lab
        fault_id = lab.add_fault(
            {"kind": "scale-out", "module": MODULE, "replica": name, "triggered_at": triggered_at}
        )
        self._emit(
            {
                "t": triggered_at,
                "event": "scale_out_triggered",
                "replica": name,
                "queue_depth": sample["depth"],
                "haproxy_qcur": sample["haproxy_qcur"],
                "engines_waiting": sample["engines_waiting"],
                "above_since": above_since,
                "threshold": self.policy.threshold,
            }
        )
        try:
            up = start_replica(lab, name, 60.0, keep_going=lambda: self._fault_recorded(fault_id))
        except LabError as exc:
            print(f"autoscaler: scale-out of {name} failed: {exc}", file=sys.stderr, flush=True)
            return
        if up["ready_at"] is not None:
            self._emit({"t": up["ready_at"], "event": "scale_out_ready", "replica": name})
        if up["enabled_at"] is None:
            print(f"autoscaler: scale-out of {name} rolled back", file=sys.stderr, flush=True)
            return
        self._emit({"t": up["enabled_at"], "event": "scale_out_enabled", "replica": name})
        deadline = time.monotonic() + 30.0
        first: float | None = None
        while time.monotonic() < deadline and self._fault_recorded(fault_id):
            first = lab.served(name, after=triggered_at)
            if first is not None:
                break
            time.sleep(0.05)
        if first is None:
            return
        # The HAProxy log line of a request is written when it ends: give it time to land, then
        # take the earliest of the ledger and the log.
        time.sleep(2.0)
        first = lab.served(name, after=triggered_at) or first
        self._emit(
            {"t": first, "event": "scale_out_serving", "replica": name, "recorded_at": time.time()}
        )

    def step(self) -> dict[str, Any]:
        """Take one sample, write it, and start a scale-out when the policy says so (never while
        an undo holds the autoscaler; the overload must then last a full ``after_s`` again).

        Returns:
            The sample (see :func:`queue_depth`), with ``"scale_out": name`` when one started.
        """
        sample = queue_depth(self.lab)
        with open(self.samples, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(sample, separators=(",", ":")) + "\n")
        if scaling_held(self.lab):  # replicas are being restored: overload must be seen anew
            sample["held"] = True
            self.policy.above_since = None
            return sample
        busy = self.busy is not None and self.busy.is_alive()
        if self.policy.observe(sample["t"], sample["depth"]) and not busy:
            name = self._candidate()
            if name is not None:
                t = sample["t"]
                self.busy = threading.Thread(
                    target=self._bring_up,
                    args=(name, sample, t, self.policy.above_since),
                    name=f"scale-out-{name}",
                )
                self.busy.start()
                sample["scale_out"] = name
                self.policy.fired(t)
        return sample

    def run_forever(self) -> None:
        """Sample every ``sample_s`` seconds (absolute deadlines) until killed."""
        next_t = time.monotonic()
        while True:
            try:
                self.step()
            except (LabError, OSError) as exc:
                print(f"autoscaler: sample failed: {exc}", file=sys.stderr, flush=True)
            next_t += self.sample_s
            delay = next_t - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            else:
                next_t = time.monotonic()


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``python -m chaoslib_infer.lab.scaling --state-dir DIR`` (the autoscaler)."""
    parser = argparse.ArgumentParser(prog="python -m chaoslib_infer.lab.scaling")
    parser.add_argument("--state-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        lab = Lab.attach(args.state_dir)
    except LabError as exc:
        print(f"autoscaler: {exc}", file=sys.stderr, flush=True)
        return 2
    print(
        f"autoscaler: lab {lab.meta.get('lab_id')} policy {lab.meta.get('scaling')}",
        file=sys.stderr,
        flush=True,
    )
    Autoscaler(lab).run_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
