"""Memory hog that makes the *kernel* OOM-kill a replica inside its memory cgroup.

Run as ``python -m chaoslib_infer.lab.hog --cgroup PATH --version 1|2``. It

1. joins the replica's cgroup (pid written to ``cgroup.procs`` before allocating anything),
2. sets its own ``oom_score_adj`` to -1000 so the kernel never picks it (without
   CAP_SYS_RESOURCE it raises the other processes in the cgroup to +1000 instead),
3. allocates touched memory in steps (``b"\\x01" * step``; 1 MiB steps once within two steps
   of the limit, so the allocation that crosses it is smaller than what the kill frees), and
   before each step checks that
   the ``oom_kill`` counter has not risen and that another process is still in the cgroup (it
   never fills a cgroup it is alone in: an unkillable process alone at the limit would hang),
4. once the counter rose, frees everything and exits 0,
5. exits anyway after ``--ttl-s`` (dead-man switch; exit status 3).

It prints one line ``armed <pid> <oom_kills> <mode>`` on stdout once it is in the cgroup.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from chaoslib_infer.lab.cgroups import CgroupError, MemoryCgroup

__all__ = ["main", "run_hog"]

HOG_MODULE = "chaoslib_infer.lab.hog"
EXIT_DONE = 0
EXIT_TTL = 3
EXIT_SETUP = 2
FINE_STEP = 1 << 20
FINE_INTERVAL_S = 0.001


def _set_oom_score_adj(pid: int | str, value: int) -> None:
    with open(f"/proc/{pid}/oom_score_adj", "w") as fh:
        fh.write(str(value))


def protect_self_or_expose_targets(cgroup: MemoryCgroup, me: int) -> str | None:
    """Make sure the kernel picks the engine, not the hog.

    Sets the hog's own ``oom_score_adj`` to -1000. Lowering it needs CAP_SYS_RESOURCE; without
    it (containers often drop it) the hog instead raises every *other* process in the cgroup to
    +1000 (always allowed), which also guarantees the engine scores higher than the hog.

    Returns:
        ``"self-1000"`` or ``"targets+1000"``; None when neither was possible (message on stderr).
    """
    try:
        _set_oom_score_adj("self", -1000)
        return "self-1000"
    except OSError as exc:
        first = exc
    targets = [p for p in cgroup.pids() if p != me]
    try:
        for pid in targets:
            _set_oom_score_adj(pid, 1000)
    except OSError as exc:
        print(
            f"hog: cannot set oom_score_adj (self -1000: {first}; targets +1000: {exc})",
            file=sys.stderr,
            flush=True,
        )
        return None
    if not targets:
        print("hog: no target process in the cgroup", file=sys.stderr, flush=True)
        return None
    return "targets+1000"


def run_hog(
    cgroup: MemoryCgroup,
    step_bytes: int = 16 << 20,
    interval_s: float = 0.02,
    ttl_s: float = 30.0,
) -> int:
    """Join ``cgroup`` and allocate until the cgroup's OOM-kill counter rises or the TTL ends."""
    import os

    me = os.getpid()
    try:
        cgroup.add_pid(me)
    except CgroupError as exc:
        print(f"hog: {exc}", file=sys.stderr, flush=True)
        return EXIT_SETUP
    mode = protect_self_or_expose_targets(cgroup, me)
    if mode is None:
        return EXIT_SETUP
    baseline = cgroup.oom_kills()
    print(f"armed {me} {baseline} {mode}", flush=True)
    deadline = time.monotonic() + ttl_s
    hoard: list[bytes] = []
    try:
        while time.monotonic() < deadline:
            if cgroup.oom_kills() > baseline:
                return EXIT_DONE
            others = [p for p in cgroup.pids() if p != me]
            if not others:
                time.sleep(interval_s)
                continue
            step, pause = step_bytes, interval_s
            limit = cgroup.limit_bytes()
            if limit is not None and limit - cgroup.usage_bytes() < 2 * step_bytes:
                # Near the limit: small steps, so that the allocation crossing it is smaller
                # than what killing the engine frees (no second OOM, never a hung hog).
                step, pause = FINE_STEP, FINE_INTERVAL_S
            hoard.append(b"\x01" * step)
            time.sleep(pause)
        return EXIT_TTL
    finally:
        hoard.clear()


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(prog=f"python -m {HOG_MODULE}")
    parser.add_argument("--cgroup", required=True, type=Path)
    parser.add_argument("--version", type=int, choices=(1, 2), default=1)
    parser.add_argument("--step-mb", type=int, default=16)
    parser.add_argument("--interval-s", type=float, default=0.02)
    parser.add_argument("--ttl-s", type=float, default=30.0)
    args = parser.parse_args(argv)
    return run_hog(
        MemoryCgroup(args.cgroup, args.version),
        step_bytes=args.step_mb << 20,
        interval_s=args.interval_s,
        ttl_s=args.ttl_s,
    )


if __name__ == "__main__":
    sys.exit(main())
