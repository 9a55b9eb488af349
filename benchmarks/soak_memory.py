#!/usr/bin/env python3
"""Soak memory and report time: does a long run stay small?

Two figures against the targets of the load client (a 30-minute soak at 500 requests/s keeps the
client under 300 MB RSS; the report from one million records renders in under 30 s):

1. **Client RSS under a soak.** ``chaos-infer load soak`` (the real command: Poisson arrivals, the
   short/mid/long prompt mix, records streamed to disk, HDR statistics) runs at ``--rate`` req/s
   for ``--duration`` against a server pinned to one core, the client pinned to the other. The
   client's resident set (``/proc/PID/status`` ``VmRSS``, and ``VmHWM`` for the peak) is sampled
   every second. Printed: peak RSS, the RSS slope over the run after its first ``--warmup-s``
   seconds (least squares, MB/min), and a **projection** to 30 minutes (last RSS + slope x the
   remaining time): measured for the duration run, extrapolated beyond it. ``--duration 30m`` runs
   the full soak and then the 30-minute figure is measured, not projected.

   The server is the fake SSE server (``chaoslib_infer.load.fakeserver``, ``--tokens`` content
   chunks per stream written at once) by default: the zero-latency lab engine tops out near
   400-450 streamed req/s on one core of this machine, below the 500 req/s asked. ``--server
   engine`` uses the engine instead (then the client also runs the mix's real stream lengths).

2. **Report time of a million records.** ``--records`` synthetic attempt records in our record
   format (``docs/contracts.md`` section 3; the soak's stream-length mix, lognormal TTFT/ITL, 1 %
   failures) are written to a JSONL file, then the report is computed from the file the way
   ``load soak`` and ``load.soak.stream_report`` do (records streamed line by line, HDR
   histograms): wall seconds are printed against the 30 s target.

Usage::

    .venv/bin/python benchmarks/soak_memory.py                   # 120 s soak + 1M records
    .venv/bin/python benchmarks/soak_memory.py --duration 30m    # the full soak

Exit status: 0 when it ran (whatever the figures), 2 on bad input or when the soak failed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchkit: run, or loaded by path
from benchkit import BenchError, check_cores, pinned_engine, stop, work_dir  # noqa: E402

TARGET_RSS_MB = 300.0
TARGET_REPORT_S = 30.0
FULL_SOAK_S = 1800.0


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``2m``, ``1h`` -> seconds.

    Raises:
        ValueError: anything else, or not > 0.
    """
    units = {"s": 1.0, "m": 60.0, "h": 3600.0}
    t = text.strip()
    try:
        v = float(t[:-1]) * units[t[-1]] if t and t[-1] in units else float(t)
    except ValueError:
        raise ValueError(f"bad duration {text!r} (e.g. 120s, 30m)") from None
    if not (v > 0 and math.isfinite(v)):
        raise ValueError(f"duration must be > 0, got {text!r}")
    return v


# ------------------------------------------------------------------------ servers


@contextlib.contextmanager
def fake_server(core: int, tokens: int) -> Iterator[str]:
    """The fake SSE server pinned to ``core``; yields its base URL for ``tokens``-chunk streams."""
    cmd = ["taskset", "-c", str(core), sys.executable, "-m", "chaoslib_infer.load.fakeserver"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if not line.isdigit():
            raise BenchError(f"the fake server did not start (exit {proc.poll()})")
        yield f"http://127.0.0.1:{line}/tokens={tokens}"
    finally:
        stop(proc)


@contextlib.contextmanager
def sim_engine(core: int) -> Iterator[str]:
    """The zero-latency lab engine pinned to ``core``; yields its base URL."""
    args = [
        "--port", "0", "--zero-latency", "--load-delay-s", "0", "--warmup-requests", "0",
        "--prefill-s-per-token", "0", "--max-num-seqs", "4096", "--max-waiting", "16384",
        "--kv-bytes-per-token", "0", "--no-admin-faults", "--model", "sim",
    ]  # fmt: skip
    with pinned_engine(core, args) as (_proc, port, deadline):
        import urllib.request

        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                    break
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"


# ------------------------------------------------------------------------ part 1: soak RSS


def _rss_mb(pid: int) -> tuple[float, float] | None:
    """``(VmRSS, VmHWM)`` of ``pid`` in MB (10^6 bytes), None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    got = dict(re.findall(r"^(VmRSS|VmHWM):\s+(\d+) kB", text, re.M))
    if "VmRSS" not in got:
        return None
    return int(got["VmRSS"]) * 1024 / 1e6, int(got.get("VmHWM", got["VmRSS"])) * 1024 / 1e6


def slope_per_min(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of ``(seconds, MB)`` points, in MB per minute (None: < 3 points)."""
    if len(points) < 3:
        return None
    n = len(points)
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    den = sum((t - mt) ** 2 for t, _ in points)
    if den == 0:
        return None
    return 60.0 * sum((t - mt) * (v - mv) for t, v in points) / den


def soak_rss(a: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Run ``chaos-infer load soak`` pinned to the client core and sample its RSS every second.

    Returns:
        ``{"server", "url", "samples" [(s, rss_mb)], "peak_mb", "last_mb", "slope_mb_min",
        "report", "exit_work_s"}`` (``report``: the soak's own report.json; ``exit_work_s``:
        seconds from that report to the process's exit, None when not seen).

    Raises:
        BenchError: the soak command failed, or overran its duration by 120 s (the message
            carries the RSS figures so far).
    """
    server = (
        fake_server(a.server_core, a.tokens) if a.server == "fake" else sim_engine(a.server_core)
    )
    with server as url:
        out = work / "soak"
        cli = shutil.which("chaos-infer", path=str(Path(sys.executable).parent)) or "chaos-infer"
        cmd = [
            "taskset", "-c", str(a.client_core), cli, "load", "soak", "--target", url,
            "--out", str(out), "--duration", f"{a.duration_s:g}s", "--rate", str(a.rate),
            "--client-ceiling", "0", "--timeout-s", "30",
        ]  # fmt: skip
        if a.server == "engine":
            cmd += ["--model", "sim"]
        log = work / "soak.log"
        samples: list[tuple[float, float]] = []
        peak = 0.0
        with open(log, "w") as fh:
            proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT)
            t0 = time.monotonic()
            deadline = t0 + a.duration_s + 120
            report_at: float | None = None  # when report.json appeared: the run itself ended
            try:
                while proc.poll() is None:
                    got = _rss_mb(proc.pid)
                    if got is not None:
                        samples.append((time.monotonic() - t0, got[0]))
                        peak = max(peak, got[1])
                    if report_at is None and (out / "report.json").exists():
                        report_at = time.monotonic()
                    if time.monotonic() > deadline:
                        raise BenchError(
                            "the soak overran its duration by 120 s "
                            + ("after its report was written (its exit work: Locust CSV stats)"
                               if report_at is not None else "before its report was written")
                            + f"; client RSS so far: peak {peak:.1f} MB (VmHWM), last "
                            f"{samples[-1][1] if samples else float('nan'):.1f} MB"
                        )  # fmt: skip
                    time.sleep(1.0)
            finally:
                stop(proc)
            exited = time.monotonic()
        if proc.returncode != 0:
            tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
            raise BenchError(f"the soak failed (exit {proc.returncode}): {tail[0][:300]}")
    report = json.loads((out / "report.json").read_text())
    (work / "rss.csv").write_text(
        "t_s,rss_mb\n" + "".join(f"{t:.1f},{v:.2f}\n" for t, v in samples)
    )
    steady = [(t, v) for t, v in samples if t >= a.warmup_s]
    return {
        "url": url,
        "samples": samples,
        "peak_mb": peak,
        "last_mb": samples[-1][1] if samples else None,
        "slope_mb_min": slope_per_min(steady),
        "steady_points": len(steady),
        "report": report,
        # from the report written to the process's exit (Locust CSV stats from the records)
        "exit_work_s": None if report_at is None else exited - report_at,
    }


# ------------------------------------------------------------------------ part 2: 1M records


def write_synthetic_records(path: Path, n: int, seed: int = 0) -> float:
    """Write ``n`` attempt records (contract format) as the soak produces them; returns seconds.

    Stream lengths follow the soak's default mix (70 % 32 tokens, 25 % 128, 5 % 256); TTFT and
    inter-token gaps are lognormal; 1 % of attempts fail (``http_5xx`` / ``timeout_ttft``).
    Timestamps are unix seconds at full float precision, like the client's.
    """
    from chaoslib_infer.load.records import RecordWriter
    from chaoslib_infer.load.soak import MIX_CLASSES

    rng = random.Random(seed)
    names = ["short", "mid", "long"]
    weights = [70, 25, 5]
    t = time.perf_counter()
    start = time.time()
    with RecordWriter(path) as w:
        for i in range(n):
            intended = start + i / 500.0
            sent = intended + rng.expovariate(2000.0)
            cls = rng.choices(names, weights)[0]
            toks = MIX_CLASSES[cls][1]
            u = rng.random()
            rec: dict[str, Any] = {
                "request_id": f"soak-{i}", "attempt": 1, "final": True, "intended_at": intended,
                "sent_at": sent, "status": 200, "ok": True, "error_class": None, "error": None,
                "first_byte_at": None, "first_token_at": None, "chunk_times": [],
                "end_at": sent, "output_tokens": 0, "tokens_source": "chunks",
                "replica": "r0", "text_len": 0,
            }  # fmt: skip
            if u < 0.005:
                rec.update(status=503, ok=False, error_class="http_5xx", error="HTTP 503",
                           end_at=sent + 0.002)  # fmt: skip
            elif u < 0.01:
                rec.update(status=200, ok=False, error_class="timeout_ttft",
                           error="no output within 30.0 s", end_at=sent + 30.0)  # fmt: skip
            else:
                ft = sent + rng.lognormvariate(-3.5, 0.6)
                ct = [ft]
                for _ in range(toks - 1):
                    ct.append(ct[-1] + rng.lognormvariate(-4.2, 0.4))
                rec.update(first_byte_at=ft - 0.0005, first_token_at=ft, chunk_times=ct,
                           end_at=ct[-1] + 0.0002, output_tokens=toks, tokens_source="usage",
                           text_len=4 * toks)  # fmt: skip
            w.write(rec)
    return time.perf_counter() - t


def time_report(path: Path) -> tuple[float, dict[str, Any]]:
    """Seconds to compute the report of a records file (``load.soak.stream_report``)."""
    from chaoslib_infer.load.soak import stream_report

    t = time.perf_counter()
    summary = stream_report(path)
    return time.perf_counter() - t, summary


# ------------------------------------------------------------------------ main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (``--help``)."""
    p = argparse.ArgumentParser(
        prog="soak_memory.py",
        description=(
            "Client RSS during a soak at 500 req/s (peak, slope, 30-minute projection) and the "
            "time to compute the report of one million records, against the 300 MB and 30 s "
            "targets."
        ),
    )
    p.add_argument(
        "--duration",
        default="120s",
        help="soak length, e.g. 120s, 30m (default %(default)s; 30m = the full soak)",
    )
    p.add_argument("--rate", type=float, default=500.0, help="mean arrival rate, req/s (500)")
    p.add_argument(
        "--server",
        choices=("fake", "engine"),
        default="fake",
        help="fake SSE server (default) or the zero-latency lab engine",
    )
    p.add_argument(
        "--tokens",
        type=int,
        default=64,
        help="content chunks per stream from the fake server (default 64, about the "
        "mix's mean of 67)",
    )
    p.add_argument(
        "--warmup-s",
        type=float,
        default=20.0,
        help="seconds left out of the RSS slope (default %(default)s)",
    )
    p.add_argument(
        "--records",
        type=int,
        default=1_000_000,
        help="synthetic records for the report timing (default %(default)s; 0 skips)",
    )
    p.add_argument("--skip-soak", action="store_true", help="only the report timing")
    p.add_argument("--server-core", type=int, default=0, help="core of the server (default 0)")
    p.add_argument("--client-core", type=int, default=1, help="core of the client (default 1)")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="keep records and logs here (default: a temporary folder, removed)",
    )
    a = p.parse_args(argv)  # fmt: skip
    try:
        a.duration_s = parse_duration(a.duration)
    except ValueError as exc:
        p.error(str(exc))
    if not (a.rate > 0 and math.isfinite(a.rate)) or a.tokens < 1 or a.records < 0:
        p.error("--rate must be > 0, --tokens >= 1, --records >= 0")
    if a.warmup_s < 0 or a.warmup_s >= a.duration_s:
        p.error("--warmup-s must be >= 0 and shorter than --duration")
    check_cores(p, a, ("server_core", "client_core"))
    return a


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; see the module docstring. Returns the exit status."""
    a = parse_args(argv)
    with work_dir(a.out, "soak-memory-") as work:
        if not a.skip_soak:
            _print_soak(a, soak_rss(a, work))
        if a.records:
            path = work / "synthetic-records.jsonl"
            gen_s = write_synthetic_records(path, a.records)
            size_mb = path.stat().st_size / 1e6
            report_s, summary = time_report(path)
            path.unlink()
            print(
                f"report of {a.records:,} records ({size_mb:,.0f} MB JSONL, written in "
                f"{gen_s:.0f} s): {report_s:.1f} s with load.soak.stream_report (target < "
                f"{TARGET_REPORT_S:.0f} s: {'PASS' if report_s < TARGET_REPORT_S else 'FAIL'}); "
                f"ratio to target {report_s / TARGET_REPORT_S:.2f}; it read {summary['requests']:,} "
                f"records, P99 E2E {summary['p99_e2e_s']:.3f} s"
            )
    return 0


def _print_soak(a: argparse.Namespace, res: dict[str, Any]) -> None:
    rep = res["report"]
    stats = rep.get("stats") or {}
    server = (f"fake SSE server ({a.tokens} chunks per stream)" if a.server == "fake"
              else "zero-latency lab engine")  # fmt: skip
    print(
        f"soak: {a.rate:g} req/s Poisson for {a.duration_s:g} s against the {server} on core "
        f"{a.server_core}, client (`chaos-infer load soak`) on core {a.client_core}; sent "
        f"{rep.get('sent')}, "
        + (f"ok {stats['ok']}" if "ok" in stats else "ok not reported (an invalid soak's latencies are withheld)")
        + f", valid={rep.get('valid')}"
        + (f" ({rep.get('invalid_reason')})" if not rep.get("valid") else "")
        + (f", send-lag P99 {1000 * rep['lag_p99_s']:.1f} ms" if rep.get("lag_p99_s") is not None else ", send-lag unmeasured")
    )  # fmt: skip
    if res.get("exit_work_s") is not None:
        print(f"after the run: {res['exit_work_s']:.1f} s from the report to the process's exit "
              "(the Locust CSV stats re-read the records; RSS sampled until the exit)")  # fmt: skip
    peak, last, slope = res["peak_mb"], res["last_mb"], res["slope_mb_min"]
    print(f"client RSS: peak {peak:.1f} MB (VmHWM), last {last:.1f} MB; target < "
          f"{TARGET_RSS_MB:.0f} MB: {'PASS' if peak < TARGET_RSS_MB else 'FAIL'} "
          f"(peak / target {peak / TARGET_RSS_MB:.2f})")  # fmt: skip
    if slope is None:
        print("RSS slope: not enough samples after the warm-up")
        return
    remaining = max(FULL_SOAK_S - a.duration_s, 0.0)
    proj = max(peak, last + slope * remaining / 60.0)
    kind = "measured" if remaining == 0 else "PROJECTION (linear, from the slope)"
    print(
        f"RSS slope after the first {a.warmup_s:g} s: {slope:+.2f} MB/min over "
        f"{res['steady_points']} samples; 30-minute RSS {kind}: {proj:.1f} MB (target < "
        f"{TARGET_RSS_MB:.0f} MB: {'PASS' if proj < TARGET_RSS_MB else 'FAIL'}, ratio "
        f"{proj / TARGET_RSS_MB:.2f})"
    )


if __name__ == "__main__":
    # SIGTERM unwinds like Ctrl-C: the server and the soak are stopped on the way out
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        sys.exit(main())
    except BenchError as exc:
        print(f"soak_memory: error: {exc}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
