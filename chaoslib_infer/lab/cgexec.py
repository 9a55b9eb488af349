"""Exec wrapper: join a cgroup, then become the command.

Run as ``python -m chaoslib_infer.lab.cgexec --cgroup PATH -- cmd [args...]``. The wrapper writes
its own pid into ``PATH/cgroup.procs`` and then ``os.execvp``'s the command, so the pid that
supervisord watches *is* the engine's pid, and every restart rejoins the cgroup.
"""

from __future__ import annotations

import argparse
import os
import sys

__all__ = ["command_after_dashes", "exec_command", "join_cgroup", "main"]


def command_after_dashes(parser: argparse.ArgumentParser, rest: list[str]) -> list[str]:
    """The command of an ``argparse.REMAINDER`` argument, without a leading ``--``.

    ``rest`` is the remainder as parsed (``["--", "cmd", "arg", ...]`` or ``["cmd", ...]``); the
    result is ``["cmd", "arg", ...]``. An empty command ends the program through
    ``parser.error`` (exit 2, usage on stderr).
    """
    cmd = list(rest)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        parser.error("no command given after --")
    return cmd


def join_cgroup(cgroup: str, prog: str) -> int | None:
    """Move this process into the cgroup directory ``cgroup`` (writes its pid to ``cgroup.procs``).

    Returns ``None`` once joined, or exit status 125 after printing
    ``"<prog>: cannot join cgroup <cgroup>: <error>"`` on stderr when the write fails.
    """
    try:
        with open(os.path.join(cgroup, "cgroup.procs"), "w") as fh:
            fh.write(f"{os.getpid()}\n")
    except OSError as exc:
        print(f"{prog}: cannot join cgroup {cgroup}: {exc}", file=sys.stderr, flush=True)
        return 125
    return None


def exec_command(cmd: list[str], prog: str) -> int:
    """Replace this process with ``cmd`` (``os.execvp``, looked up on ``PATH``).

    Returns only when the exec fails: exit status 127 after printing
    ``"<prog>: cannot exec <cmd[0]>: <error>"`` on stderr.
    """
    try:
        os.execvp(cmd[0], cmd)
    except OSError as exc:
        print(f"{prog}: cannot exec {cmd[0]}: {exc}", file=sys.stderr, flush=True)
        return 127
    return 127  # pragma: no cover - execvp does not return


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, join the cgroup and exec the command (returns only on error)."""
    parser = argparse.ArgumentParser(prog="python -m chaoslib_infer.lab.cgexec")
    parser.add_argument("--cgroup", required=True, help="cgroup directory to join")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- command [args...]")
    args = parser.parse_args(argv)
    cmd = command_after_dashes(parser, args.cmd)
    failed = join_cgroup(args.cgroup, "cgexec")
    if failed is not None:
        return failed
    return exec_command(cmd, "cgexec")


if __name__ == "__main__":
    sys.exit(main())
