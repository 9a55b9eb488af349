"""Client ceiling: the highest streamed request rate this client sustains, and the refusal rule.

``measure_ceiling`` runs the client closed-loop (``concurrency`` workers, each sending its next
request as soon as the previous one ends) against a lab engine in zero-latency mode for
``duration_s`` and reports completed streamed requests per second. Against a zero-latency engine
the client (and the box) is the bottleneck, so this is an upper bound on what any phase can ask of
one client process.

Refusal rule (``check_rate``): a phase that needs more than half of the ceiling from one process is
refused (its latencies would include client-side queueing), unless it is sharded across
``shards`` processes so that each needs at most half (``shard.run_sharded``).

``sim_engine`` starts ``python -m chaoslib_infer.lab.engine`` on a free loopback port (no load
delay, no warm-up) and stops it (SIGTERM, then SIGKILL) on exit: used by the ceiling command, the
benchmarks and the tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from chaoslib_infer.errors import TargetUnreachable

from .client import LoadSpec, build_body, endpoint_url, make_session, new_loop, send_attempt

__all__ = [
    "CEILING_FILE",
    "CeilingRefused",
    "check_rate",
    "listening_port",
    "load_ceiling",
    "measure_ceiling",
    "sim_engine",
]

#: Default place where ``chaos-infer load ceiling`` saves its result (per user, per machine).
CEILING_FILE = Path(os.environ.get("XDG_CACHE_HOME", str(Path.home() / ".cache"))) / (
    "chaos-infer/client_ceiling.json"
)
_LISTEN = re.compile(r"lab-engine listening .* port=(\d+)")


def listening_port(proc: subprocess.Popen[str], deadline: float) -> int | None:
    """The port a lab engine started with ``--port 0`` listens on, read from its stderr.

    ``proc`` must have ``stderr=subprocess.PIPE`` in text mode; lines are read until one says
    ``lab-engine listening ... port=N`` or ``deadline`` (``time.monotonic()``, seconds) passes.
    Returns ``N``, or ``None`` when the deadline passed or stderr ended first (the engine died).
    """
    assert proc.stderr is not None
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        m = _LISTEN.search(line)
        if m:
            return int(m.group(1))
    return None


class CeilingRefused(ValueError):
    """A phase needs more than half the client ceiling from one process."""


@contextlib.contextmanager
def sim_engine(
    zero_latency: bool = True,
    itl_s: float = 0.0,
    output_tokens: int = 16,
    max_num_seqs: int = 4096,
    extra: list[str] | None = None,
    start_timeout_s: float = 15.0,
) -> Iterator[str]:
    """Run a lab sim engine on a free loopback port for the duration of the block.

    Args:
        zero_latency: ``--zero-latency`` (no delays at all).
        itl_s: inter-token latency, seconds (ignored with ``zero_latency``).
        output_tokens: default output tokens.
        max_num_seqs: running slots (the waiting queue is 4x this).
        extra: further engine flags.
        start_timeout_s: how long to wait for the listening line, seconds.

    Yields:
        The engine's base URL ``http://127.0.0.1:PORT``.

    Raises:
        TargetUnreachable: the engine did not start in time.
    """
    cmd = [
        sys.executable, "-m", "chaoslib_infer.lab.engine", "--port", "0", "--load-delay-s", "0",
        "--warmup-requests", "0", "--itl-s", str(itl_s), "--output-tokens", str(output_tokens),
        "--max-num-seqs", str(max_num_seqs), "--max-waiting", str(4 * max_num_seqs),
        "--prefill-s-per-token", "0",
    ]  # fmt: skip
    if zero_latency:
        cmd.append("--zero-latency")
    cmd += extra or []
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        deadline = time.monotonic() + start_timeout_s
        port = listening_port(proc, deadline)
        if port is None:
            raise TargetUnreachable(f"sim engine did not start (exit {proc.poll()})")
        _wait_healthy(port, deadline)
        yield f"http://127.0.0.1:{port}"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        if proc.stderr is not None:
            proc.stderr.close()


def _wait_healthy(port: int, deadline: float) -> None:
    """Poll ``/health`` until 200 (the listening line comes before uvicorn listens)."""
    import http.client

    while time.monotonic() < deadline:  # http.client: never follows a redirect (urllib would)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
        try:
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return
        except (OSError, http.client.HTTPException):
            pass
        finally:
            conn.close()
        time.sleep(0.05)
    raise TargetUnreachable(f"sim engine on port {port} not healthy in time")


async def _closed_loop(spec: LoadSpec, concurrency: int, duration_s: float) -> dict[str, Any]:
    import random

    url = endpoint_url(spec)
    rng = random.Random(spec.seed)
    ok = failed = 0
    errors: dict[str, int] = {}
    async with make_session(spec) as session:
        # warm the connections
        bodies = [json.dumps(build_body(spec, rng)).encode() for _ in range(64)]
        end = time.perf_counter() + duration_s
        start = time.perf_counter()

        async def worker(w: int) -> None:
            nonlocal ok, failed
            i = w
            while time.perf_counter() < end:
                rec = await send_attempt(
                    session, spec, bodies[i % len(bodies)], f"c{w}-{i}", url=url
                )
                i += concurrency
                if rec["ok"]:
                    ok += 1
                else:
                    failed += 1
                    ec = rec["error_class"]
                    errors[ec] = errors.get(ec, 0) + 1

        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        elapsed = time.perf_counter() - start
    return {
        "ok": ok,
        "failed": failed,
        "elapsed_s": round(elapsed, 3),
        "ok_rps": ok / elapsed,
        "errors_by_class": errors,
    }


def measure_ceiling(
    url: str,
    duration_s: float = 5.0,
    concurrency: int = 32,
    max_tokens: int = 16,
    model: str = "chaos-sim",
) -> dict[str, Any]:
    """Closed-loop streamed requests/s of one client process (uvloop) against ``url``.

    Args:
        url: base URL of a zero-latency engine.
        duration_s: measuring time, seconds.
        concurrency: closed-loop workers.
        max_tokens: stream length (output tokens per request).
        model: model name sent.

    Returns:
        ``{"ceiling_rps", "ok", "failed", "elapsed_s", "errors_by_class", "concurrency",
        "max_tokens", "measured_at"}``; ``ceiling_rps`` counts successful streams only.
    """
    spec = LoadSpec(url=url, model=model, max_tokens=max_tokens, timeout_s=30.0)
    with asyncio.Runner(loop_factory=new_loop) as runner:
        res = runner.run(_closed_loop(spec, concurrency, duration_s))
    return {
        "ceiling_rps": round(res["ok_rps"], 1),
        "ok": res["ok"],
        "failed": res["failed"],
        "elapsed_s": res["elapsed_s"],
        "errors_by_class": res["errors_by_class"],
        "concurrency": concurrency,
        "max_tokens": max_tokens,
        "measured_at": time.time(),
    }


def load_ceiling(path: Path | None = None) -> float | None:
    """The saved ceiling in requests/s (``chaos-infer load ceiling --save``), or None."""
    p = path or CEILING_FILE
    try:
        return float(json.loads(p.read_text())["ceiling_rps"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def check_rate(
    need_rps: float, ceiling_rps: float | None, shards: int = 1, what: str = "phase"
) -> None:
    """Apply the refusal rule.

    Args:
        need_rps: the rate the phase asks for, requests/s (all shards together).
        ceiling_rps: the client ceiling (None: unknown, nothing is refused).
        shards: processes sharing the load.
        what: phase name for the message.

    Raises:
        CeilingRefused: ``need_rps / shards`` exceeds half the ceiling.
    """
    if ceiling_rps is None or ceiling_rps <= 0:
        return
    per = need_rps / max(shards, 1)
    if per > ceiling_rps / 2:
        need = int(-(-need_rps // (ceiling_rps / 2)))
        raise CeilingRefused(
            f"{what} needs {per:.0f} req/s per process, more than half the client ceiling "
            f"({ceiling_rps:.0f} req/s); use --shards {need} or more"
        )
