"""upstream-timeout on Kubernetes: freeze the model server with SIGSTOP through ``pods/exec``.

A stopped process keeps its sockets open: connections are accepted by the kernel and then hang,
which is what a wedged upstream looks like to its clients (the drill asks whether they fail fast or
wait forever). The exec runs :data:`~chaoslib_infer.platforms.kubernetes.scripts.SIGNAL` in the
container; the processes are named by pid and start time, so the thaw never signals a reused pid.

**PID 1.** The first process of a PID namespace (the container's PID 1, unless the pod sets
``shareProcessNamespace``) only receives signals from inside its namespace for which it installed
a handler, and SIGSTOP/SIGKILL cannot have one: ``kill -STOP 1`` run by ``kubectl exec`` succeeds
and does nothing (pid_namespaces(7); checked against the kernel in tests/test_k8s_faults.py). So
``pid=1`` ("the container's main process") is resolved first (:func:`resolve_targets`):

- PID 1 is an init or a shell (tini, dumb-init, catatonit, sh, bash, ...): its descendants (the
  model server and its workers) are frozen;
- PID 1 belongs to another container (``shareProcessNamespace: true``, PID 1 is ``pause``): every
  process of the target container is frozen;
- PID 1 is the model server itself (the usual ``python3 -m vllm...`` entrypoint): its descendants
  are frozen (vLLM's engine core, SGLang's scheduler, TGI's shards), so the server still accepts
  connections and its requests hang, its health endpoint often still answering; ``how`` in the
  result says so. Without any child process it is refused with one line: use :mod:`.policy` (a
  NetworkPolicy that drops its ingress) or run the server under an init.

Any other ``pid`` freezes that process and its descendants. A dead-man timer started in the
container thaws them after ``ttl_s`` even when the rollback never runs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from chaoslib_infer.platforms.kubernetes import K8sError
from chaoslib_infer.platforms.kubernetes import scripts as S
from chaoslib_infer.platforms.kubernetes.exec import run_script
from chaoslib_infer.platforms.kubernetes.pods import read_pod_if_present
from chaoslib_infer.safety.redact import clip
from chaoslib_infer.safety.signals import held_interrupts

__all__ = [
    "INIT_COMMS",
    "Proc",
    "container_id",
    "freeze",
    "parse_probe",
    "probe",
    "resolve_targets",
    "thaw",
]

#: ``comm`` names of inits and shells that run the model server as a child (their children can be
#: frozen while they themselves stay up as PID 1).
INIT_COMMS = frozenset(
    {
        "tini",
        "tini-static",
        "dumb-init",
        "catatonit",
        "docker-init",
        "s6-svscan",
        "runsvdir",
        "sh",
        "bash",
        "dash",
        "ash",
        "busybox",
        "pause",
    }
)


@dataclass(frozen=True)
class Proc:
    """One process as seen from inside the container (``/proc``)."""

    pid: int
    ppid: int
    start: str  # field 22 of /proc/PID/stat (clock ticks since boot)
    state: str  # R, S, D, T, t, Z, ...
    same_cgroup: bool  # in the cgroup of the exec'd helper, i.e. of the target container
    comm: str


def parse_probe(lines: list[str]) -> tuple[int, list[Proc]]:
    """Decode the output of :data:`~chaoslib_infer.platforms.kubernetes.scripts.PROBE`.

    Returns:
        ``(helper pid, processes)``.

    Raises:
        K8sError: the output is not a probe's.
    """
    helper, procs = None, []
    for line in lines:
        parts = line.split(" ", 6)
        if parts[0] == "self" and len(parts) == 2:
            helper = int(parts[1])
        elif parts[0] == "proc" and len(parts) == 7:
            procs.append(
                Proc(
                    int(parts[1]),
                    int(parts[2]),
                    parts[3],
                    parts[4],
                    parts[5] == "1",
                    parts[6],
                )
            )
    if helper is None:
        raise K8sError(f"unexpected process listing from the container: {' | '.join(lines[:3])}")
    return helper, procs


def _descendants(procs: list[Proc], root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for p in procs:
        children.setdefault(p.ppid, []).append(p.pid)
    out: set[int] = set()
    todo = [root]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out and c != root:
                out.add(c)
                todo.append(c)
    return out


def resolve_targets(procs: list[Proc], helper: int, pid: int = 1) -> tuple[list[Proc], str]:
    """Which processes to stop for "freeze process ``pid``" (see the module docstring).

    Args:
        procs: the container's processes (:func:`parse_probe`).
        helper: the probe's own pid (it and its descendants are never targets).
        pid: 1 for the container's main process, else a pid as seen in the container.

    Returns:
        ``(targets sorted by pid, how they were chosen in words)``.

    Raises:
        K8sError: PID 1 is the model server and has no child (unsupported, one line), no such process, or
            nothing to freeze.
    """
    by = {p.pid: p for p in procs}
    skip = {helper} | _descendants(procs, helper)
    if pid == 1:
        init = by.get(1)
        if init is None:
            raise K8sError("no PID 1 visible in the container's /proc", 404)
        if not init.same_cgroup:
            ids = {p.pid for p in procs if p.same_cgroup} - skip
            how = f"PID 1 ({init.comm}) is another container's (shared process namespace): every process of the container"
        elif init.comm in INIT_COMMS:
            ids = {i for i in _descendants(procs, 1) if by[i].same_cgroup} - skip
            how = f"PID 1 is {init.comm} (an init): its descendants"
            if not ids:
                raise K8sError(f"PID 1 is {init.comm} and has no child process to freeze")
        else:
            ids = {i for i in _descendants(procs, 1) if by[i].same_cgroup} - skip
            how = (
                f"PID 1 ({init.comm}) is the model server, which SIGSTOP cannot reach from inside "
                "its PID namespace: its descendants (engine workers); it still accepts connections"
            )
            if not ids:
                raise K8sError(
                    f"PID 1 of the container is the model server itself ({init.comm}) and has no "
                    "child process: a PID namespace's init ignores SIGSTOP sent from inside its "
                    "namespace (pid_namespaces(7)), so exec 'kill -STOP 1' would do nothing; run "
                    "the server under an init (tini, dumb-init), set shareProcessNamespace: true, "
                    "or block its ingress instead (k8s_block_pod_ingress)"
                )
    else:
        if pid not in by or pid in skip:
            raise K8sError(f"no process {pid} in the container", 404)
        ids = {pid} | (_descendants(procs, pid) - skip)
        how = f"process {pid} ({by[pid].comm}) and its descendants"
    if not ids:
        raise K8sError("no process of the container to freeze")
    return sorted((by[i] for i in ids), key=lambda p: p.pid), how


def container_id(pod: dict[str, Any], container: str) -> str | None:
    """``status.containerStatuses[name=container].containerID`` (changes when it restarts)."""
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") == container:
            return cs.get("containerID")
    return None


def probe(
    core: Any, namespace: str, pod: str, container: str, interpreter: str | None = None
) -> tuple[str, int, list[Proc]]:
    """List the container's processes (one exec).

    Returns:
        ``(interpreter used, helper pid, processes)``.

    Raises:
        K8sError: exec refused (403/404), no interpreter, or the probe failed.
    """
    used, res = run_script(core, namespace, pod, container, S.PROBE, [], interpreter)
    if res.exit_code != 0:
        raise K8sError(
            f"process listing in pod {namespace}/{pod} failed (exit {res.exit_code}): "
            f"{clip((res.stderr or res.message).strip(), 200)}"
        )
    helper, procs = parse_probe(res.lines)
    return used, helper, procs


def _signal(
    core: Any,
    saved: dict[str, Any],
    sig: str,
    ttl_s: float,
) -> tuple[dict[int, str], dict[str, Any] | None]:
    pairs = [f"{t['pid']}:{t['start']}" for t in saved["targets"]]
    _, res = run_script(
        core,
        saved["namespace"],
        saved["pod"],
        saved["container"],
        S.SIGNAL,
        [sig, f"{ttl_s:g}", *pairs],
        saved["interpreter"],
    )
    if res.exit_code != 0:
        raise K8sError(
            f"kill -{sig} in pod {saved['namespace']}/{saved['pod']} failed (exit "
            f"{res.exit_code}): {clip((res.stderr or res.message).strip(), 200)}"
        )
    outcome: dict[int, str] = {}
    timer = None
    for line in res.lines:
        parts = line.split()
        if parts[0] == "timer" and len(parts) == 3:
            timer = {"pid": int(parts[1]), "start": parts[2]}
        elif parts[0] in ("sent", "gone", "failed") and len(parts) >= 2:
            outcome[int(parts[1])] = parts[0]
    return outcome, timer


def freeze(
    core: Any,
    saved: dict[str, Any],
    ttl_s: float,
    save: Any,
    verify_s: float = 2.0,
) -> dict[str, Any]:
    """SIGSTOP the processes in ``saved["targets"]`` (after a dead-man timer is armed), then verify.

    Args:
        core: ``CoreV1Api``.
        saved: ``{"namespace", "pod", "container", "interpreter", "targets": [{"pid", "start",
            "comm"}]}``, already stored durably by the caller.
        ttl_s: the in-container dead-man timer, seconds (0: none).
        save: callable storing the updated state (the timer is added to ``saved``).
        verify_s: how long to wait for every target to show state ``T``, seconds.

    Returns:
        ``{"stopped": [pids], "not_stopped": [pids], "timer": {"pid", "start"} | None,
        "stopped_at" (unix s)}``.

    Raises:
        K8sError: the exec failed, or no target is stopped after ``verify_s`` (they are sent
            SIGCONT again first).
    """
    with held_interrupts():  # the timer is recorded before a Ctrl-C can reach the rollback
        outcome, timer = _signal(core, saved, "STOP", ttl_s)
        stopped_at = time.time()
        saved["timer"] = timer
        save(saved)
    want = {t["pid"]: t["start"] for t in saved["targets"] if outcome.get(t["pid"]) == "sent"}
    deadline = time.monotonic() + verify_s
    states: dict[int, str] = {}
    while True:
        _, _, procs = probe(
            core, saved["namespace"], saved["pod"], saved["container"], saved["interpreter"]
        )
        states = {p.pid: p.state for p in procs if want.get(p.pid) == p.start}
        if all(states.get(p) in ("T", "t") for p in want) or time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    stopped = sorted(p for p in want if states.get(p) in ("T", "t"))
    if not stopped:
        _signal(core, saved, "CONT", 0)
        seen = ", ".join(f"{p}:{states.get(p, '?')}" for p in sorted(want)) or "all gone"
        raise K8sError(
            f"pod {saved['namespace']}/{saved['pod']}: no process stopped after SIGSTOP ({seen})"
        )
    return {
        "stopped": stopped,
        "not_stopped": sorted(t["pid"] for t in saved["targets"] if t["pid"] not in stopped),
        "timer": timer,
        "stopped_at": stopped_at,
    }


def thaw(core: Any, saved: dict[str, Any]) -> str:
    """SIGCONT the frozen processes and end the dead-man timer; a no-op when they are gone.

    Returns:
        One line saying what was done.

    Raises:
        K8sError: the pod could not be read (403) or the exec failed (403 ...). A pod that is
            gone (404) or a container that restarted since the freeze is not an error: the frozen
            processes went with it.
    """
    ns, pod = saved["namespace"], saved["pod"]
    doc = read_pod_if_present(core, ns, pod)
    if doc is None:
        return f"pod {ns}/{pod} is gone; its frozen processes went with it"
    if container_id(doc, saved["container"]) != saved.get("container_id"):
        return f"container {saved['container']} of pod {ns}/{pod} restarted since the freeze; nothing to thaw"
    outcome, _ = _signal(core, saved, "CONT", 0)
    timer = saved.get("timer")
    if timer:
        run_script(
            core,
            ns,
            pod,
            saved["container"],
            S.KILL_TREE,
            [str(timer["pid"]), str(timer["start"])],
            saved["interpreter"],
        )
    sent = sorted(p for p, o in outcome.items() if o == "sent")
    gone = sorted(p for p, o in outcome.items() if o != "sent")
    line = f"SIGCONT sent to {', '.join(map(str, sent)) or 'no process'} in pod {ns}/{pod}"
    return line + (f" ({', '.join(map(str, gone))} gone)" if gone else "")
