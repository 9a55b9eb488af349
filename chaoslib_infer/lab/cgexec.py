"""Exec wrapper: join a cgroup, then become the command.

Run as ``python -m chaoslib_infer.lab.cgexec --cgroup PATH -- cmd [args...]``. The wrapper writes
its own pid into ``PATH/cgroup.procs`` and then ``os.execvp``'s the command, so the pid that
supervisord watches *is* the engine's pid, and every restart rejoins the cgroup.
"""

from __future__ import annotations

import argparse
import os
import sys

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, join the cgroup and exec the command (returns only on error)."""
    parser = argparse.ArgumentParser(prog="python -m chaoslib_infer.lab.cgexec")
    parser.add_argument("--cgroup", required=True, help="cgroup directory to join")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- command [args...]")
    args = parser.parse_args(argv)
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        parser.error("no command given after --")
    try:
        with open(os.path.join(args.cgroup, "cgroup.procs"), "w") as fh:
            fh.write(f"{os.getpid()}\n")
    except OSError as exc:
        print(f"cgexec: cannot join cgroup {args.cgroup}: {exc}", file=sys.stderr, flush=True)
        return 125
    try:
        os.execvp(cmd[0], cmd)
    except OSError as exc:
        print(f"cgexec: cannot exec {cmd[0]}: {exc}", file=sys.stderr, flush=True)
        return 127
    return 127  # pragma: no cover - execvp does not return


if __name__ == "__main__":
    sys.exit(main())
