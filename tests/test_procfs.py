"""``lab.procfs``: what /proc says about a process, read the way the lab and the ledger rely on."""

from __future__ import annotations

import os
import subprocess
import sys

from chaoslib_infer.lab import procfs

RACE = """
import subprocess, sys
from chaoslib_infer.lab import procfs
big = bytearray(256 * 1024 * 1024)  # a big parent makes the child's execve slower
big[::4096] = b"\\x01" * len(big[::4096])
empty = 0
for i in range(60):
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "marker-arg", str(i)])
    try:
        if not procfs.cmdline(p.pid).endswith(f" marker-arg {i} "):
            empty += 1
    finally:
        p.kill()
        p.wait(timeout=5)
print(empty)
"""


def test_cmdline_of_a_process_just_started_names_its_arguments() -> None:
    """``Popen`` can return while the child is still inside ``execve``: the kernel closes the
    close-on-exec pipe Popen waits on before it sets the new arguments (seen on CI: the ledger
    refused a memory hog it had just started because its command line read empty; 13 of 100
    starts from a 300 MB parent read empty without the retry)."""
    out = subprocess.run(
        [sys.executable, "-c", RACE], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "0", out.stdout + out.stderr
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert procfs.state(proc.pid) in ("R", "S", "D")
        assert procfs.start_time(proc.pid) is not None
    finally:
        proc.kill()
        proc.wait(timeout=5)


def test_a_gone_process_reads_empty_and_none() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=10)
    assert procfs.cmdline(proc.pid) == ""
    assert procfs.state(proc.pid) is None and procfs.start_time(proc.pid) is None
    assert procfs.cmdline(os.getpid()).startswith(sys.executable) or "pytest" in procfs.cmdline(
        os.getpid()
    )
