"""What the OpenAI SDK client costs per request (CPU), beside our raw client.

One lab engine (``--itl-s`` between tokens, ``--max-tokens`` tokens per stream), then the same
open-loop load (``--rate`` requests/s for ``--duration-s``) sent by each client in turn, in this
process's event loop; prints, per client, the run summary's client CPU seconds per completed
request (``client_cpu_s / ok``: user + system CPU of the load's process, ``clientside.client_cpu``)
and its CPU share. Not a test: run it by hand on a quiet machine (a busy one inflates both)::

    .venv/bin/python benchmarks/sdk_client_cpu.py --rate 40 --duration-s 10 --rounds 3
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from chaoslib_infer.load.client import LoadSpec, run_load_blocking


def _engine(work: Path, itl_s: float) -> tuple[subprocess.Popen[bytes], str]:
    log = (work / "engine.log").open("w")
    argv = [sys.executable, "-m", "chaoslib_infer.lab.engine", "--host", "127.0.0.1", "--port",
            "0", "--replica-id", "b0", "--ledger", str(work / "ledger.jsonl"), "--load-delay-s",
            "0", "--warmup-requests", "0", "--itl-s", str(itl_s), "--prefill-s-per-token", "0"]  # fmt: skip
    proc = subprocess.Popen(argv, stderr=log)
    deadline = time.monotonic() + 20
    while not (m := re.search(r"port=(\d+)", (work / "engine.log").read_text())):
        if time.monotonic() > deadline or proc.poll() is not None:
            raise SystemExit("the engine did not start")
        time.sleep(0.05)
    url = f"http://127.0.0.1:{m.group(1)}"
    while True:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.05)


def main() -> None:
    """Parse arguments, run each client ``--rounds`` times, print the medians."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", type=float, default=40.0)
    p.add_argument("--duration-s", type=float, default=10.0)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--itl-s", type=float, default=0.005)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        proc, url = _engine(work, a.itl_s)
        try:
            for client in ("raw", "openai-sdk"):
                per_req, shares, oks = [], [], []
                for _ in range(a.rounds):
                    spec = LoadSpec(url=url, rate_rps=a.rate, duration_s=a.duration_s,
                                    max_tokens=a.max_tokens, client=client)  # fmt: skip
                    s = run_load_blocking(spec, work / "records.jsonl")
                    per_req.append(s["client_cpu_s"] / max(s["ok"], 1))
                    shares.append(s["client_cpu_share"])
                    oks.append(f"{s['ok']}/{s['sent']} in {s['elapsed_s']:.1f} s")
                print(
                    f"{client:>10}: {statistics.median(per_req) * 1e6:7.0f} us CPU per request "
                    f"(rounds {', '.join(f'{x * 1e6:.0f}' for x in per_req)}), CPU share "
                    f"{statistics.median(shares):.3f} at {a.rate:g} req/s ({'; '.join(oks)} ok)"
                )
        finally:
            proc.kill()


if __name__ == "__main__":
    main()
