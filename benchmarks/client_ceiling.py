#!/usr/bin/env python3
"""Client ceiling: our streaming client against the peer load generators, one client core each.

One zero-latency lab engine (``python -m chaoslib_infer.lab.engine --zero-latency``) is pinned to
one core; every client in turn (ours, then AIPerf, GuideLLM, inference-perf and vLLM's
``vllm bench serve``) is pinned to the other core and runs closed-loop at the same concurrency
against it, each request a ``/v1/completions`` stream of exactly ``--max-tokens`` tokens
(``max_tokens`` plus ``ignore_eos`` or the tool's equivalent; the engine's own token counter
checks it). For each tool the script prints:

* ``own req/s``: the completed-request rate the tool reports about itself;
* ``engine req/s``: requests the engine completed while the tool ran (its
  ``vllm:request_success_total`` counter, sampled every 0.2 s; the rate over the middle 90 % of
  the tool's requests, so start-up and tail are left out). This is the honest number;
* ``client CPU``: the share of its core the tool's whole process tree used over that window,
  and ``req/core-s``: engine-counted requests per client CPU-second (``/proc`` accounting). A
  client that does not fill its core (here: the one-core engine is the bottleneck) would carry
  this many requests per second on a full core.

A bare C client, ``h2load`` (nghttp2, Debian's ``nghttp2-client``; HTTP/1.1, the same
concurrency and request body, no parsing of the stream at all), runs in the same rounds as the
floor of what one client core can drive: our cost per request is printed as a multiple of its
(its req/core-s over ours). It is not a peer: it never enters the ratio.

Then the ratios of ours to the best peer, on engine req/s and on req/core-s, and our TTFT error at
50 % and 90 % of our ceiling (``--ttft-fractions``): our client sends open-loop Poisson traffic at
that share of its engine-counted rate, and each request's TTFT (send to first output chunk, from
its record) is compared with the engine's own TTFT of the same request id (``--ttft-log``). The
engine takes kernel socket stamps for it (``chaoslib_infer.lab.kernel_stamps``): from the moment
the request's last byte arrived on its socket to the moment the first token's bytes left it, so
its own accept/parse queueing is inside the truth, not counted as client error; our client's
times are kernel stamps too (``time_source: "kernel"`` records). The error splits in two legs,
send -> engine arrival and engine first token out -> our first-token stamp, and the client's own
lag (``p99_client_lag_s``: kernel stamp to handling) is printed beside it. The line before the
last is ``cost_vs_floor=<float>``: our CPU per request over h2load's (its req/core-s over ours;
``nan`` without the floor). The last line is
``ratio_vs_best_peer=<float>``: req/core-s of ours over the best peer's (``nan`` when no peer
ran); on a machine where the clients fill their core it equals the req/s ratio. The ``ours`` row
notes the chunk path our client ran (``chunk_path`` of its summary: ``compiled`` or ``python``;
``CHAOS_INFER_CHUNK_PATH=python`` in the environment runs the pure-Python one).

Peers are installed into throw-away virtual environments under ``--peer-dir`` (default
``/tmp/chaos-infer-peers/<tool>``, kept across runs; never inside the repository), with
``nice -n 10`` and a time cap per tool. A peer that cannot be installed or run (no GPU, no network,
no suitable Python) is skipped with a one-line reason. vLLM is installed without its GPU
dependencies (``--no-deps``, then the CPU ``torch`` pip finds locally and vLLM's pure-Python
requirements); when that does not give a working ``vllm bench serve`` it is skipped. None of the
tools can download a tokenizer here: a small byte-level BPE tokenizer is built locally with the
``tokenizers`` library from a peer's environment and given to every peer.

Usage::

    .venv/bin/python benchmarks/client_ceiling.py                 # all peers, 15 s each
    .venv/bin/python benchmarks/client_ceiling.py --peers vllm --skip-install --duration-s 8

Exit status: 0 when the benchmark ran (whatever the figures), 2 on bad input or when our own
client or the engine failed.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchkit: run, or loaded by path
from benchkit import BenchError, check_cores, pinned_engine, stop, work_dir  # noqa: E402

MODEL = "chaos-sim"
PEERS = ("aiperf", "guidellm", "inference-perf", "vllm", "locust", "locust-recorded")
TRANSPORTS = ("aiohttp", "raw")
DEFAULT_PEER_DIR = Path("/tmp/chaos-infer-peers")
SAMPLE_S = 0.2
_TCK = os.sysconf("SC_CLK_TCK")
_SUCCESS = re.compile(r"^vllm:request_success_total\{[^}]*\} ([0-9.e+]+)$", re.M)
_GEN_TOKENS = re.compile(r"^vllm:generation_tokens_total\{[^}]*\} ([0-9.e+]+)$", re.M)
# vLLM requirements that are GPU kernels or CUDA builds of torch: not needed by its benchmark
# client, left out of the CPU-only install (everything else vLLM requires is installed).
_VLLM_GPU_DEPS = re.compile(
    r"^(torch|torchaudio|torchvision|torchcodec|pynvvideocodec|flashinfer|apache-tvm-ffi|tilelang|"
    r"nvidia|nvtx|fastsafetensors|instanttensor|quack-kernels|tokenspeed|humming|zentorch)",
    re.I,
)
#: The CPU build of torch that pip finds on this machine's disk (``find-links``).
_CPU_TORCH = "torch==2.13.0"


# ------------------------------------------------------------------------ /proc accounting


def _proc_table() -> dict[int, tuple[int, float]]:
    """``{pid: (ppid, cpu seconds incl. reaped children)}`` for every process (Linux /proc)."""
    out: dict[int, tuple[int, float]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                raw = fh.read()
        except OSError:
            continue
        f = raw[raw.rfind(b")") + 2 :].split()
        # fields after the name: state ppid ... utime(11) stime(12) cutime(13) cstime(14)
        out[int(name)] = (int(f[1]), (int(f[11]) + int(f[12]) + int(f[13]) + int(f[14])) / _TCK)
    return out


#: run-queue wait share over which a run's figures are flagged as taken on a shared machine
#: (quiet runs here read 1-3 %; runs beside a test run 38-45 %: benchmarks/README.md)
SHARED_RUNQ = 0.10


def tree_usage(root: int) -> tuple[float, float]:
    """``(cpu_s, runq_s)`` of ``root`` and all its descendants: CPU seconds used so far (reaped
    children included) and seconds spent runnable but waiting for a CPU (``/proc/PID/schedstat``
    of the live processes' main threads: other work on the same core)."""
    table = _proc_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    total, runq, stack, seen = 0.0, 0.0, [root], set()
    while stack:
        pid = stack.pop()
        if pid in seen or pid not in table:
            continue
        seen.add(pid)
        total += table[pid][1]
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(f"/proc/{pid}/schedstat", "rb") as fh:
                runq += int(fh.read().split()[1]) / 1e9
        stack.extend(children.get(pid, []))
    return total, runq


# ------------------------------------------------------------------------ the engine


@dataclass
class Engine:
    """A running zero-latency sim engine."""

    proc: subprocess.Popen[str]
    url: str
    ttft_log: Path

    def counters(self) -> tuple[float, float]:
        """``(completed requests, generated tokens)`` from the engine's ``/metrics``."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=5) as resp:
            text = resp.read().decode()
        done = sum(float(x) for x in _SUCCESS.findall(text))
        toks = sum(float(x) for x in _GEN_TOKENS.findall(text))
        return done, toks


@contextlib.contextmanager
def run_engine(core: int, max_tokens: int, workdir: Path) -> Iterator[Engine]:
    """Start the zero-latency engine pinned to ``core`` (``taskset``) with a TTFT log; stop it
    (SIGTERM, then SIGKILL) on exit.

    Raises:
        BenchError: it did not start within 20 s.
    """
    ttft_log = workdir / "engine-ttft.jsonl"
    args = [
        "--port", "0", "--zero-latency", "--load-delay-s", "0", "--warmup-requests", "0",
        "--prefill-s-per-token", "0", "--output-tokens", str(max_tokens), "--max-num-seqs", "4096",
        "--max-waiting", "16384", "--model", MODEL, "--no-admin-faults",
        "--kv-bytes-per-token", "0", "--ttft-log", str(ttft_log),
    ]  # fmt: skip
    with pinned_engine(core, args) as (proc, port, deadline):
        eng = Engine(proc, f"http://127.0.0.1:{port}", ttft_log)
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                eng.counters()
                break
            time.sleep(0.05)
        else:
            raise BenchError("the sim engine never answered /metrics")
        yield eng


# ------------------------------------------------------------------------ one tool run


@dataclass
class Run:
    """Result of one tool's run."""

    tool: str
    own_rps: float | None = None
    engine_rps: float | None = None
    tokens_per_req: float | None = None
    cpu_util: float | None = None
    req_per_core_s: float | None = None
    window_s: float | None = None
    runq_share: float | None = None
    requests: int = 0
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def steady_window(samples: list[tuple[float, ...]]) -> tuple[int, int] | None:
    """Indices ``(i0, i1)`` of the samples bounding the middle 90 % of the requests served.

    Args:
        samples: ``(t, completed, ...)`` rows in time order.

    Returns:
        The bounding indices, or None when fewer than 50 requests were served or the window is
        shorter than 1 s.
    """
    if len(samples) < 3:
        return None
    c0, c1 = samples[0][1], samples[-1][1]
    total = c1 - c0
    if total < 50:
        return None
    lo, hi = c0 + 0.05 * total, c1 - 0.05 * total
    i0 = next(i for i, s in enumerate(samples) if s[1] >= lo)
    i1 = max(i for i, s in enumerate(samples) if s[1] <= hi)
    if i1 <= i0 or samples[i1][0] - samples[i0][0] < 1.0:
        return None
    return i0, i1


def run_tool(
    name: str,
    argv: list[str],
    engine: Engine,
    core: int,
    timeout_s: float,
    log_path: Path,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> tuple[Run, int]:
    """Run ``argv`` pinned to ``core`` while sampling the engine's counters and the tool's CPU.

    The tool runs in its own session (process group) so that a timeout ends its whole tree.

    Returns:
        ``(run, exit status)``; ``run`` has the engine-side figures filled in (or a note).
    """
    samples: list[tuple[float, float, float, float, float]] = []
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            ["taskset", "-c", str(core), *argv], stdout=log, stderr=subprocess.STDOUT,
            env=env, cwd=cwd, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        try:
            while proc.poll() is None:
                if time.monotonic() > deadline:
                    stop(proc, group=True)
                    break
                t = time.perf_counter()
                try:
                    done, toks = engine.counters()
                except OSError:
                    done = toks = math.nan
                cpu, runq = tree_usage(proc.pid)
                if math.isfinite(done):
                    samples.append((t, done, toks, cpu, runq))
                time.sleep(max(0.0, SAMPLE_S - (time.perf_counter() - t)))
        finally:
            if proc.poll() is None:
                stop(proc, group=True)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # stragglers of the tool's tree
    rc = proc.returncode
    run = Run(name)
    with contextlib.suppress(OSError):
        last = samples[-1][3:] if samples else (0.0, 0.0)
        samples.append((time.perf_counter(), *engine.counters(), *last))
    if samples:
        run.requests = int(samples[-1][1] - samples[0][1])
        served_toks = samples[-1][2] - samples[0][2]
        if run.requests:
            run.tokens_per_req = served_toks / run.requests
    win = steady_window(samples)
    if win is None:
        run.note = f"too few requests served ({run.requests}) for a rate"
        return run, rc
    (t0, c0, _, u0, q0), (t1, c1, _, u1, q1) = samples[win[0]], samples[win[1]]
    run.window_s = t1 - t0
    run.engine_rps = (c1 - c0) / run.window_s
    cpu = u1 - u0
    run.cpu_util = cpu / run.window_s
    run.runq_share = max(q1 - q0, 0.0) / run.window_s
    run.req_per_core_s = (c1 - c0) / cpu if cpu > 0 else None
    return run, rc


def wait_idle(engine: Engine, quiet_s: float = 1.0, limit_s: float = 30.0) -> None:
    """Wait until the engine's completed counter stops moving for ``quiet_s``."""
    end = time.monotonic() + limit_s
    last, since = None, time.monotonic()
    while time.monotonic() < end:
        with contextlib.suppress(OSError):
            now = engine.counters()[0]
            if now != last:
                last, since = now, time.monotonic()
            elif time.monotonic() - since >= quiet_s:
                return
        time.sleep(0.2)


# ------------------------------------------------------------------------ peers


@dataclass
class Ctx:
    """What every tool command needs."""

    url: str
    max_tokens: int
    concurrency: int
    duration_s: float
    tokenizer: Path | None
    workdir: Path
    peer_dir: Path
    expected_rps: float = 1000.0  # sizes the request count of tools that take a count

    def count(self) -> int:
        """Requests for a count-driven tool: about ``duration_s`` at our own rate."""
        return max(1000, int(self.duration_s * self.expected_rps))


@dataclass
class Peer:
    """One peer tool: how to install it, run it, and read its own rate."""

    name: str
    python: str  # minimum "3.X" for its venv
    install: Callable[[Path, Path, float], None]  # (venv, python, deadline) -> None; raises
    check: list[str]  # command (relative to the venv's bin/) that proves it runs
    command: Callable[[Ctx, Path, Path], list[str]]  # (ctx, venv, run dir) -> argv
    own_rate: Callable[[Path, str], float | None]  # (run dir, log text) -> req/s
    env: dict[str, str] = field(default_factory=lambda: dict(_OFFLINE_ENV))  # added to os.environ
    own_venv: bool = False  # runs from this project's environment (sys.prefix), nothing installed


#: No tool may try the network (there is none but the package registries here).
_OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "NO_COLOR": "1",
}  # fmt: skip


def _pip(venv: Path, args: list[str], deadline: float) -> None:
    left = deadline - time.monotonic()
    if left <= 0:
        raise BenchError("install time cap reached")
    cmd = ["nice", "-n", "10", str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *args]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=left)
    except subprocess.TimeoutExpired:
        raise BenchError("install time cap reached") from None
    if p.returncode != 0:
        lines = [x for x in (p.stderr or p.stdout).splitlines() if "ERROR" in x] or ["?"]
        raise BenchError(f"pip install {' '.join(args)} failed: {lines[0][:200]}")


def _simple_install(pkg: str) -> Callable[[Path, Path, float], None]:
    def install(venv: Path, python: Path, deadline: float) -> None:
        _pip(venv, [pkg], deadline)

    return install


def _vllm_install(venv: Path, python: Path, deadline: float) -> None:
    """vLLM without its GPU stack: the local CPU torch pip finds, ``vllm --no-deps``, then vLLM's
    other requirements minus ``_VLLM_GPU_DEPS``."""
    _pip(venv, [_CPU_TORCH], deadline)  # the CPU build lies on this machine's disk
    _pip(venv, ["--no-deps", "vllm"], deadline)
    py = str(venv / "bin" / "python")
    script = (
        "import importlib.metadata as m\n"
        "for r in m.requires('vllm') or []:\n"
        "    if 'extra ==' not in r: print(r)\n"
    )
    reqs = subprocess.run([py, "-c", script], capture_output=True, text=True, check=True).stdout
    keep = [r for r in reqs.splitlines() if not _VLLM_GPU_DEPS.match(r.strip())]
    req_file = venv / "cpu-requirements.txt"
    req_file.write_text("\n".join(keep) + "\n")
    pin = venv / "cpu-constraints.txt"  # a requirement wanting another torch fails, never a
    pin.write_text(_CPU_TORCH + "\n")  # CUDA download of several GB
    _pip(venv, ["-r", str(req_file), "-c", str(pin)], deadline)


def _aiperf_cmd(ctx: Ctx, venv: Path, out: Path) -> list[str]:
    return [
        str(venv / "bin" / "aiperf"), "profile", "--model", MODEL, "--url", ctx.url,
        "--endpoint-type", "completions", "--streaming", "--concurrency", str(ctx.concurrency),
        "--benchmark-duration", str(ctx.duration_s), "--prompt-input-tokens-mean", "16",
        "--prompt-input-tokens-stddev", "0", "--prompt-output-tokens-mean", str(ctx.max_tokens),
        "--prompt-output-tokens-stddev", "0", "--extra-inputs", "ignore_eos:true",
        "--use-server-token-count", "--tokenizer", str(ctx.tokenizer),
        "--output-artifact-dir", str(out), "--ui-type", "none", "--no-server-metrics",
        "--no-gpu-telemetry", "--no-auto-plot",
    ]  # fmt: skip


def _aiperf_rate(out: Path, _log: str) -> float | None:
    for f in out.rglob("profile_export_aiperf.json"):
        return float(json.loads(f.read_text())["request_throughput"]["avg"])
    return None


def _guidellm_cmd(ctx: Ctx, venv: Path, out: Path) -> list[str]:
    scenario = {
        "spec": {
            "backend": {
                "kind": "openai_http", "target": ctx.url, "model": MODEL,
                "request_format": "/v1/completions", "max_tokens": ctx.max_tokens, "http2": False,
                "extras": {"body": {"ignore_eos": True}},
            },
            "profile": {"kind": "concurrent", "streams": ctx.concurrency},
            "data": [{"kind": "synthetic_text", "prompt_tokens": 16, "output_tokens": ctx.max_tokens}],
            "tokenizer": {"kind": "huggingface_auto", "model": str(ctx.tokenizer)},
            "constraints": [{"kind": "max_duration", "seconds": ctx.duration_s}],
            "outputs": [{"kind": "json", "path": str(out / "benchmarks.json")}],
        }
    }  # fmt: skip
    (out / "scenario.json").write_text(json.dumps(scenario))
    return [
        str(venv / "bin" / "guidellm"), "run", "--scenario", str(out / "scenario.json"),
        "--disable-progress",
    ]  # fmt: skip


def _find_number(obj: Any, path: list[str]) -> float | None:
    for key in path:
        if isinstance(obj, list):
            obj = obj[0] if obj else None
        if not isinstance(obj, dict) or key not in obj:
            return None
        obj = obj[key]
    return float(obj) if isinstance(obj, int | float) else None


def _guidellm_rate(out: Path, _log: str) -> float | None:
    f = out / "benchmarks.json"
    if not f.exists():
        return None
    data = json.loads(f.read_text())
    for path in (
        ["benchmarks", "metrics", "requests_per_second", "successful", "mean"],
        ["benchmarks", "metrics", "request_throughput", "successful", "mean"],
    ):
        v = _find_number(data, path)
        if v is not None:
            return v
    return None


def _inference_perf_cmd(ctx: Ctx, venv: Path, out: Path) -> list[str]:
    cfg = {
        "load": {
            "type": "concurrent",
            "stages": [{"num_requests": ctx.count(), "concurrency_level": ctx.concurrency}],
            "num_workers": 1,
        },
        "api": {"type": "completion", "streaming": True},
        "server": {"type": "vllm", "model_name": MODEL, "base_url": ctx.url, "ignore_eos": True},
        "tokenizer": {"pretrained_model_name_or_path": str(ctx.tokenizer)},
        "data": {
            "type": "random",
            "input_distribution": {"min": 12, "max": 20, "mean": 16, "std_dev": 2, "total_count": 5000},
            "output_distribution": {
                "min": ctx.max_tokens, "max": ctx.max_tokens, "mean": ctx.max_tokens,
                "std_dev": 0, "total_count": 5000,
            },
        },
        "report": {"request_lifecycle": {"summary": True, "per_stage": True, "per_request": False}},
        "storage": {"local_storage": {"path": str(out / "reports")}},
    }  # fmt: skip
    (out / "config.yml").write_text(json.dumps(cfg))  # JSON is YAML
    return [str(venv / "bin" / "inference-perf"), "--config_file", str(out / "config.yml")]


def _inference_perf_rate(out: Path, _log: str) -> float | None:
    for f in sorted(out.rglob("summary_lifecycle_metrics.json")):
        data = json.loads(f.read_text())
        for path in (
            ["successes", "throughput", "requests_per_sec"],
            ["load_summary", "achieved_rate"],
        ):
            v = _find_number(data, path)
            if v is not None:
                return v
    return None


def _vllm_cmd(ctx: Ctx, venv: Path, out: Path) -> list[str]:
    return [
        str(venv / "bin" / "vllm"), "bench", "serve", "--backend", "openai",
        "--base-url", ctx.url, "--endpoint", "/v1/completions", "--model", MODEL,
        "--tokenizer", str(ctx.tokenizer), "--dataset-name", "random",
        "--random-input-len", "16", "--random-output-len", str(ctx.max_tokens),
        "--ignore-eos", "--num-prompts", str(ctx.count()),
        "--max-concurrency", str(ctx.concurrency), "--request-rate", "inf",
        "--save-result", "--result-dir", str(out), "--result-filename", "result.json",
        "--disable-tqdm",
    ]  # fmt: skip


def _vllm_rate(out: Path, _log: str) -> float | None:
    f = out / "result.json"
    if not f.exists():
        return None
    v = json.loads(f.read_text()).get("request_throughput")
    return float(v) if isinstance(v, int | float) else None


_LOCUST_DIR = Path(__file__).resolve().parent / "locust_peers"


def _own_venv_install(venv: Path, python: Path, deadline: float) -> None:
    """Locust peers run from this project's own environment (locust is in its dev extra)."""


def _locust_cmd(locustfile: str, record: bool = False) -> Callable[[Ctx, Path, Path], list[str]]:
    def command(ctx: Ctx, venv: Path, out: Path) -> list[str]:
        records = ["--chaos-records", str(out / "records.jsonl")] if record else []
        return [
            "env", f"CEILING_MAX_TOKENS={ctx.max_tokens}", f"CEILING_MODEL={MODEL}",
            str(venv / "bin" / "locust"), "-f", str(_LOCUST_DIR / locustfile), "--headless",
            "-u", str(ctx.concurrency), "-r", str(ctx.concurrency),
            "-t", f"{max(1, round(ctx.duration_s))}s", "--host", ctx.url, "--only-summary",
            "--stop-timeout", "2", "--csv", str(out / "locust"), *records,
        ]  # fmt: skip

    return command


def _locust_rate(out: Path, _log: str) -> float | None:
    f = out / "locust_stats.csv"
    if not f.exists():
        return None
    for row in csv.DictReader(f.read_text().splitlines()):
        if row.get("Name") == "Aggregated":
            return float(row["Requests/s"])
    return None


PEER_SPECS: dict[str, Peer] = {
    "aiperf": Peer(
        "aiperf", "3.10", _simple_install("aiperf"), ["aiperf", "--version"], _aiperf_cmd,
        _aiperf_rate, env={"DO_NOT_TRACK": "1", "NO_COLOR": "1"},  # HF offline mode breaks a
    ),                                                             # local tokenizer folder
    "guidellm": Peer(
        "guidellm", "3.10", _simple_install("guidellm"), ["guidellm", "--version"], _guidellm_cmd,
        _guidellm_rate,
    ),
    "inference-perf": Peer(
        "inference-perf", "3.12", _simple_install("inference-perf"), ["inference-perf", "--help"],
        _inference_perf_cmd, _inference_perf_rate,
    ),
    "vllm": Peer(
        "vllm", "3.10", _vllm_install, ["vllm", "bench", "serve", "--help"], _vllm_cmd, _vllm_rate
    ),
    # Locust's FastHttpUser counting chunks only, and this project's recording Locust user: the
    # pair prices the recording (issue 15); both run from this project's own environment
    "locust": Peer(
        "locust", "3.11", _own_venv_install, ["locust", "--version"], _locust_cmd("counting.py"),
        _locust_rate, own_venv=True,
    ),
    "locust-recorded": Peer(
        "locust-recorded", "3.11", _own_venv_install, ["locust", "--version"],
        _locust_cmd("recorded.py", record=True), _locust_rate, own_venv=True,
    ),
}  # fmt: skip


#: the bare C client, the floor of what one core drives (not a peer: never in the ratio)
FLOOR = "h2load"
_H2LOAD_RATE = re.compile(r"finished in [0-9.]+s, ([0-9.]+) req/s")


def ensure_h2load(skip_install: bool, cap_s: float) -> str:
    """The path of ``h2load``, installing Debian's ``nghttp2-client`` first when it is missing
    (root, not ``skip_install``).

    Raises:
        BenchError: with the one-line reason it cannot be used.
    """
    found = shutil.which("h2load")
    if found:
        return found
    if skip_install or os.geteuid() != 0 or not shutil.which("apt-get"):
        raise BenchError("h2load not installed (apt-get install -y nghttp2-client)")
    print("installing nghttp2-client (h2load) ...", file=sys.stderr, flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(["nice", "-n", "10", "apt-get", "install", "-y", "nghttp2-client"],
                       env=env, capture_output=True, timeout=cap_s, check=False)  # fmt: skip
    found = shutil.which("h2load")
    if not found:
        raise BenchError("could not install nghttp2-client (h2load) with apt-get")
    return found


def _run_floor(h2load: str, eng: Engine, a: argparse.Namespace, out: Path) -> Run | str:
    """One closed-loop ``h2load --h1`` run: ``--concurrency`` connections, one request in
    flight each, the body our client sends (``max_tokens`` + ``ignore_eos``), ``--duration-s``.
    Returns its figures, or the one-line reason it gave none."""
    out.mkdir(parents=True, exist_ok=True)
    body = out / "body.json"
    body.write_text(json.dumps({
        "model": MODEL, "prompt": " ".join(["hello"] * 12), "max_tokens": a.max_tokens,
        "stream": True, "ignore_eos": True,
    }))  # fmt: skip
    print("running h2load (floor) ...", file=sys.stderr, flush=True)
    cmd = [h2load, "--h1", "-c", str(a.concurrency), "-t", "1", "-m", "1",
           "-D", str(max(1, round(a.duration_s))), "-d", str(body),
           "-H", "Content-Type: application/json", eng.url + "/v1/completions"]  # fmt: skip
    run, rc = run_tool(FLOOR, cmd, eng, a.client_core, a.duration_s + 60, out / "log.txt")
    text = (out / "log.txt").read_text(errors="replace")
    m = _H2LOAD_RATE.search(text)
    if m:
        run.own_rps = float(m.group(1))
    return _outcome(run, rc, text)


def _outcome(run: Run, rc: int, text: str) -> Run | str:
    """``run`` (noted ``exit N`` on a non-zero exit ``rc``), or why it does not count: the engine
    served too few requests (the last line of the tool's log ``text`` then says why)."""
    if run.engine_rps is None:
        tail = [x for x in text.splitlines() if x.strip()][-1:] or ["no output"]
        return f"ran but served too few requests (exit {rc}): {tail[0][:200]}"
    if rc != 0:
        run.note = f"exit {rc}"
    return run


def find_python(minimum: str) -> Path | None:
    """A Python interpreter >= ``minimum`` (``"3.12"``): this one, ``python3.X`` on PATH, or a
    pyenv version. Prefers the running interpreter's minor version (pip finds local wheels for it).
    """
    want = tuple(int(x) for x in minimum.split("."))
    if sys.version_info[:2] >= want:
        return Path(sys.executable)
    cands: list[str] = []
    for minor in range(want[1], want[1] + 4):
        found = shutil.which(f"python3.{minor}")
        if found:
            cands.append(found)
        root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
        cands += sorted(str(p) for p in root.glob(f"3.{minor}.*/bin/python3"))
    for c in cands:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            p = subprocess.run([c, "-c", "import sys, venv; print(sys.version_info[:2])"],
                               capture_output=True, text=True, timeout=20)  # fmt: skip
            if (
                p.returncode == 0
                and tuple(json.loads(p.stdout.replace("(", "[").replace(")", "]"))) >= want
            ):
                return Path(c)
    return None


def ensure_peer(peer: Peer, peer_dir: Path, skip_install: bool, cap_s: float) -> Path:
    """The peer's working venv, installing it first unless ``skip_install``.

    Raises:
        BenchError: with the one-line reason it cannot be used.
    """
    if peer.own_venv:
        venv = Path(sys.prefix)
        _check_peer(peer, venv)
        return venv
    venv = peer_dir / peer.name
    marker = venv / ".chaos-infer-ok"
    if marker.exists():
        return venv
    if skip_install:
        raise BenchError(f"not installed in {venv} (--skip-install)")
    python = find_python(peer.python)
    if python is None:
        raise BenchError(f"needs Python >= {peer.python}, none found")
    if venv.exists():
        shutil.rmtree(venv)
    peer_dir.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + cap_s
    print(
        f"installing {peer.name} into {venv} (cap {cap_s:.0f} s) ...", file=sys.stderr, flush=True
    )
    subprocess.run([str(python), "-m", "venv", str(venv)], check=True, capture_output=True)
    try:
        peer.install(venv, python, deadline)
        _check_peer(peer, venv)
    except BaseException:
        shutil.rmtree(venv, ignore_errors=True)  # a half install is no cache
        raise
    marker.write_text(time.strftime("%Y-%m-%dT%H:%M:%S\n"))
    return venv


def _check_peer(peer: Peer, venv: Path) -> None:
    argv = [str(venv / "bin" / peer.check[0]), *peer.check[1:]]
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired:
        raise BenchError(f"`{' '.join(peer.check)}` hung for 180 s") from None
    if p.returncode != 0:
        err = [x for x in (p.stderr + p.stdout).splitlines() if x.strip()]
        raise BenchError(f"`{' '.join(peer.check)}` fails: {(err[-1] if err else '?')[:200]}")


_TOKENIZER_SCRIPT = r"""
import json, sys
from pathlib import Path
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
words = ("the model token cache drill chaos latency replica stream batch queue memory kernel "
         "signal request server fleet recovery warm load prefill decode a of and to is cafe naive "
         "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november "
         "oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu river stone "
         "cloud paper engine garden window silver orange market planet bridge candle forest , .")
words = words.split()
corpus = [" ".join(words[i:] + words[:i]) for i in range(len(words))] * 20
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.train_from_iterator(corpus, trainers.BpeTrainer(
    vocab_size=600, special_tokens=["<s>", "</s>", "<unk>"], show_progress=False,
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
tok.save(str(out / "tokenizer.json"))
(out / "tokenizer_config.json").write_text(json.dumps({
    "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
    "unk_token": "<unk>", "model_max_length": 32768,
    "chat_template": "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"}))
(out / "config.json").write_text(json.dumps({"model_type": "llama",
                                             "vocab_size": tok.get_vocab_size()}))
"""


def ensure_tokenizer(peer_dir: Path, venvs: list[Path]) -> Path | None:
    """A local byte-level BPE tokenizer directory (HF format), built once with the first venv
    whose Python has ``tokenizers``; None when none has it."""
    out = peer_dir / "tokenizer"
    if (out / "tokenizer.json").exists():
        return out
    for venv in venvs:
        p = subprocess.run([str(venv / "bin" / "python"), "-c", _TOKENIZER_SCRIPT, str(out)],
                           capture_output=True, text=True, timeout=120)  # fmt: skip
        if p.returncode == 0 and (out / "tokenizer.json").exists():
            return out
    return None


# ------------------------------------------------------------------------ our client


def ours_main(argv: list[str]) -> None:
    """``client_ceiling.py _ours MODE URL DURATION_S CONCURRENCY MAX_TOKENS RATE OUT [TRANSPORT]``:
    run our client (``LoadSpec.transport`` TRANSPORT, default the spec's default; records
    streamed to ``OUT``) and print its summary as JSON.

    MODE ``closed``: CONCURRENCY attempts in flight, each followed at once by the next, for
    DURATION_S (:func:`_closed_loop`: ``send_attempt`` on one session, a fresh body and request
    id each, every record written, as ``run_load`` does; since issue 20 ``run_load`` records a
    request due at a full cap as ``not_sent`` instead of waiting, so a closed loop can no longer
    be made of its schedule). MODE ``open``: ``run_load``, Poisson arrivals at RATE req/s.
    """
    from chaoslib_infer.load.client import LoadSpec, run_load_blocking

    mode, url, dur, conc, toks, rate, out = argv[:7]
    closed = mode == "closed"
    transport = {"transport": argv[7]} if len(argv) > 7 else {}
    spec = LoadSpec(
        **transport,  # type: ignore[arg-type]
        url=url, api="completions", model=MODEL, rate_rps=1.0 if closed else float(rate),
        duration_s=float(dur), max_concurrency=int(conc), max_tokens=int(toks), prompt_words=12,
        arrival="poisson", timeout_s=30.0, extra_body={"ignore_eos": True},
    )  # fmt: skip
    summary = _closed_loop(spec, out) if closed else run_load_blocking(spec, out)
    print(
        json.dumps(
            {
                k: summary.get(k)
                for k in (
                    "ok",
                    "failed",
                    "ok_rps",
                    "elapsed_s",
                    "errors_by_class",
                    "chunk_path",
                    "time_source",
                )
            }  # fmt: skip
        )
    )


def _closed_loop(spec: Any, out: str) -> dict[str, Any]:
    """``spec.max_concurrency`` workers on one session, each sending its next attempt as soon as
    the last one ended, for ``spec.duration_s``; every record written to ``out`` (JSONL).

    Returns:
        ``{"ok", "failed", "ok_rps", "elapsed_s", "errors_by_class", "chunk_path",
        "time_source"}`` (``run_load``'s names; ``chunk_path`` and ``time_source`` of the
        records, ``"mixed"`` when they differ).
    """
    import asyncio
    import random

    from chaoslib_infer.load.client import build_body, make_session, send_attempt
    from chaoslib_infer.load.records import RecordWriter

    counts: dict[str, int] = {}
    seen: dict[str, set[str]] = {"chunk_path": set(), "time_source": set()}

    async def go(writer: RecordWriter) -> float:
        async with make_session(spec) as session:
            start = time.perf_counter()
            end = start + spec.duration_s

            async def worker(k: int) -> None:
                rng, i = random.Random(k), 0
                while time.perf_counter() < end:
                    body = json.dumps(build_body(spec, rng)).encode()
                    rec = await send_attempt(session, spec, body, f"c{k}-{i}", 1, None)
                    writer.write(rec)
                    cls = rec["error_class"] or "ok"
                    counts[cls] = counts.get(cls, 0) + 1
                    for key, vals in seen.items():
                        vals.add(str(rec.get(key)))
                    i += 1

            await asyncio.gather(*(worker(k) for k in range(spec.max_concurrency)))
            return time.perf_counter() - start

    try:
        import uvloop

        factory: Any = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        factory = None
    with RecordWriter(out) as writer, asyncio.Runner(loop_factory=factory) as runner:
        elapsed = runner.run(go(writer))
    ok = counts.pop("ok", 0)
    one = {k: (v.pop() if len(v) == 1 else "mixed") for k, v in seen.items()}
    return {"ok": ok, "failed": sum(counts.values()), "ok_rps": round(ok / elapsed, 3),
            "elapsed_s": round(elapsed, 3), "errors_by_class": counts, **one}  # fmt: skip


def ttft_error(records_path: Path, ttft_log: Path) -> dict[str, Any]:
    """Client TTFT minus the engine's own TTFT, per request id, in seconds.

    The truth is the engine's kernel-stamped TTFT (``ttft_kernel_s``: the request's last byte in
    on its socket to the first token's bytes out) where its ``--ttft-log`` line has it, else its
    loop-time TTFT (``ttft_s``: parsed request to first token handed to the transport). The error
    splits in two legs, from the unix times both sides log (one machine, one clock): ``up`` =
    engine arrival (``rx_at``, or first-token time minus ``ttft_s``) minus the client's send
    time: the client's send path and loopback (with the loop-time truth also the engine's HTTP
    parsing and queueing); ``down`` = the client's first-token time minus the engine's
    first-token send time (``tx_at``, or ``t``): loopback and the client's receive path.

    Returns:
        ``{"matched", "ok", "truth" ("kernel" | "loop" | "mixed"), "client_kernel" (matched
        records with ``time_source: "kernel"``), "fresh" (matched on a new connection: the
        connect is in their TTFT), "p50_s", "p99_s", "max_s", "pooled_p99_s" (the P99 without
        the fresh ones), "up_p50_s", "up_p99_s", "down_p50_s", "down_p99_s", "client_p50_s",
        "client_p99_s", "server_p50_s", "server_p99_s", "lag_p50_s", "lag_p99_s" (client lag,
        ``metrics.client_lag_s``)}``; errors as HDR percentiles of ``|error|`` with its sign kept
        (1 us resolution; a negative error means the client read lower than the truth).
    """
    from chaoslib_infer.load.records import iter_records
    from chaoslib_infer.measure.metrics import client_lag_s, percentiles_s

    server: dict[str, tuple[float, float, float, bool]] = {}
    with open(ttft_log, encoding="utf-8") as fh:
        for line in fh:
            with contextlib.suppress(ValueError, KeyError, TypeError):
                row = json.loads(line)
                if "ttft_kernel_s" in row:
                    server[row["request_id"]] = (
                        float(row["ttft_kernel_s"]), float(row["rx_at"]), float(row["tx_at"]),
                        True,
                    )  # fmt: skip
                else:
                    t = float(row["t"])
                    server[row["request_id"]] = (float(row["ttft_s"]), t - float(row["ttft_s"]),
                                                 t, False)  # fmt: skip
    errs, pooled, up, down, client, srv, lags = [], [], [], [], [], [], []
    ok = kernel_truth = client_kernel = fresh = 0
    for r in iter_records(records_path):
        if not r.get("ok") or r.get("first_token_at") is None:
            continue
        ok += 1
        got = server.get(r["request_id"])
        if got is None:
            continue
        s_ttft, s_in, s_out, kernel = got
        kernel_truth += kernel
        client_kernel += r.get("time_source") == "kernel"
        c = r["first_token_at"] - r["sent_at"]
        errs.append(c - s_ttft)
        if r.get("sent_source") == "connect":
            fresh += 1
        else:
            pooled.append(c - s_ttft)
        up.append(s_in - r["sent_at"])
        down.append(r["first_token_at"] - s_out)
        client.append(c)
        srv.append(s_ttft)
        lags.extend(client_lag_s([r]))

    def signed(vals: list[float], pcts: tuple[float, ...]) -> dict[float, float | None]:
        # percentiles of the magnitude, reported with the sign of the value at that rank
        ranked = sorted(vals, key=abs)
        got = percentiles_s([abs(v) for v in vals], pcts)
        out: dict[float, float | None] = {}
        for p in pcts:
            g = got[p]
            if g is None or not ranked:
                out[p] = g
                continue
            v = ranked[min(len(ranked) - 1, max(0, math.ceil(p / 100 * len(ranked)) - 1))]
            out[p] = math.copysign(g, v)
        return out

    pe = signed(errs, (50, 99, 100))
    pp = signed(pooled, (99,))
    pu = signed(up, (50, 99))
    pd = signed(down, (50, 99))
    pc = percentiles_s(client, (50, 99))
    ps = percentiles_s(srv, (50, 99))
    pl = percentiles_s(lags, (50, 99))
    n = len(errs)
    truth = "kernel" if n and kernel_truth == n else ("mixed" if kernel_truth else "loop")
    return {
        "matched": n, "ok": ok, "truth": truth, "client_kernel": client_kernel, "fresh": fresh,
        "p50_s": pe[50], "p99_s": pe[99], "max_s": pe[100], "pooled_p99_s": pp[99],
        "up_p50_s": pu[50], "up_p99_s": pu[99], "down_p50_s": pd[50], "down_p99_s": pd[99],
        "client_p50_s": pc[50], "client_p99_s": pc[99], "server_p50_s": ps[50],
        "server_p99_s": ps[99], "lag_p50_s": pl[50], "lag_p99_s": pl[99],
    }  # fmt: skip


# ------------------------------------------------------------------------ main


def _fmt(v: float | None, spec: str = ".0f") -> str:
    return "-" if v is None or not math.isfinite(v) else format(v, spec)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (``--help``)."""
    from chaoslib_infer.load.client import LoadSpec

    default_transport = LoadSpec.__dataclass_fields__["transport"].default
    p = argparse.ArgumentParser(
        prog="client_ceiling.py",
        description=(
            "Streamed requests/s of our load client and of the peer load generators against one "
            "zero-latency lab engine, one client core each, beside a bare C client (h2load) as the "
            "floor; the ratio ours / best peer; our TTFT error against the engine's kernel-stamped "
            "TTFT at 50 % and 90 % of our ceiling. Last line: "
            "ratio_vs_best_peer=<float> (requests per client core-second)."
        ),
        epilog="Peers are cached in --peer-dir; delete a tool's folder there to reinstall it.",
    )
    p.add_argument(
        "--peers",
        default=",".join(PEERS),
        help=f"comma-separated peers to run, of {', '.join(PEERS)}; '' for none",
    )
    p.add_argument(
        "--skip-install", action="store_true", help="use only peers already installed in --peer-dir"
    )
    p.add_argument(
        "--peer-dir",
        type=Path,
        default=DEFAULT_PEER_DIR,
        help="where peer venvs live (default %(default)s); must be outside the repo",
    )
    p.add_argument(
        "--install-cap-s",
        type=float,
        default=600.0,
        help="install time cap per peer, seconds (default %(default)s)",
    )
    p.add_argument(
        "--duration-s",
        type=float,
        default=15.0,
        help="traffic time per tool, seconds (default %(default)s)",
    )
    p.add_argument(
        "--max-tokens",
        type=int,
        default=32,
        help="stream length: output tokens per request (default %(default)s)",
    )
    p.add_argument(
        "--concurrency",
        type=int,
        default=64,
        help="requests in flight per tool (default %(default)s)",
    )
    p.add_argument(
        "--ttft-duration-s",
        type=float,
        default=15.0,
        help="length of each TTFT-error run, seconds (default %(default)s)",
    )
    p.add_argument(
        "--ttft-fractions",
        default="0.5,0.9",
        help="shares of our ceiling at which the TTFT error is measured (default %(default)s)",
    )
    p.add_argument(
        "--no-floor",
        dest="floor",
        action="store_false",
        help=f"skip the bare C client ({FLOOR}, the floor of one core)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run every tool this many times, interleaved; medians shown (default 1)",
    )
    p.add_argument(
        "--transport",
        choices=TRANSPORTS,
        default=default_transport,
        help="our client's transport for the 'ours' row, the ratio and the TTFT run "
        "(default %(default)s, LoadSpec's default)",
    )
    p.add_argument(
        "--also-transport",
        choices=(*TRANSPORTS, "none"),
        default=None,
        help="an extra row 'ours-<transport>' (ceiling and TTFT error), interleaved; default: "
        "the transport --transport is not; 'none' to skip",
    )
    p.add_argument("--engine-core", type=int, default=0, help="core of the engine (default 0)")
    p.add_argument("--client-core", type=int, default=1, help="core of each client (default 1)")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="keep logs and records here (default: a temporary folder, removed)",
    )
    a = p.parse_args(argv)  # fmt: skip
    peers = [x.strip() for x in a.peers.split(",") if x.strip()]
    bad = [x for x in peers if x not in PEER_SPECS]
    if bad:
        p.error(f"unknown peer {bad[0]!r} (known: {', '.join(PEERS)})")
    a.peer_list = list(dict.fromkeys(peers))
    if a.also_transport is None:
        a.also_transport = next(t for t in TRANSPORTS if t != a.transport)
    if a.also_transport in ("none", a.transport):
        a.also_transport = None
    try:
        a.ttft_fraction_list = [float(x) for x in a.ttft_fractions.split(",") if x.strip()]
    except ValueError:
        p.error(f"--ttft-fractions {a.ttft_fractions!r}: comma-separated numbers")
    if not all(0 < f <= 1.5 for f in a.ttft_fraction_list):
        p.error("--ttft-fractions: each share must be in (0, 1.5]")
    if not (a.duration_s >= 3 and a.ttft_duration_s >= 1):
        p.error("--duration-s must be >= 3 and --ttft-duration-s >= 1")
    if a.max_tokens < 2 or a.concurrency < 1 or a.install_cap_s <= 0 or a.rounds < 1:
        p.error("--max-tokens must be >= 2, --concurrency >= 1, --install-cap-s > 0, --rounds >= 1")
    check_cores(p, a, ("engine_core", "client_core"))
    repo = Path(__file__).resolve().parent.parent
    if a.peer_dir.resolve().is_relative_to(repo):
        p.error("--peer-dir must be outside the repository")
    return a


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; see the module docstring. Returns the exit status."""
    a = parse_args(argv)
    with work_dir(a.out, "client-ceiling-") as work:
        return _bench(a, work)


def _bench(a: argparse.Namespace, work: Path) -> int:
    skipped: dict[str, str] = {}
    venvs: dict[str, Path] = {}
    for name in a.peer_list:
        try:
            venvs[name] = ensure_peer(PEER_SPECS[name], a.peer_dir, a.skip_install, a.install_cap_s)
        except (BenchError, OSError, subprocess.SubprocessError) as exc:
            skipped[name] = str(exc) or type(exc).__name__
    h2load: str | None = None
    if a.floor:
        try:
            h2load = ensure_h2load(a.skip_install, a.install_cap_s)
        except BenchError as exc:
            skipped[FLOOR] = str(exc)
    # the Locust peers parse nothing of the text: only the other peers take a tokenizer
    tokenized = [n for n in venvs if not PEER_SPECS[n].own_venv]
    tokenizer = ensure_tokenizer(a.peer_dir, [venvs[n] for n in tokenized]) if tokenized else None
    if tokenized and tokenizer is None:
        for name in tokenized:
            skipped[name] = "no local tokenizer could be built (no peer venv has `tokenizers`)"
            del venvs[name]
    # the orchestrator (sampling thread, this loop) shares the engine's core: every tool pays it
    os.sched_setaffinity(0, {a.engine_core})
    print(
        f"client ceiling: zero-latency engine on core {a.engine_core}, each client on core "
        f"{a.client_core}; /v1/completions streams of {a.max_tokens} tokens; {a.concurrency} in "
        f"flight; {a.duration_s:g} s per tool; {a.rounds} round(s), medians shown",
        flush=True,
    )
    runs: dict[str, list[Run]] = {}
    me = [sys.executable, str(Path(__file__).resolve()), "_ours"]
    with run_engine(a.engine_core, a.max_tokens, work) as eng:
        ctx = Ctx(eng.url, a.max_tokens, a.concurrency, a.duration_s, tokenizer, work, a.peer_dir)
        for rnd in range(a.rounds):
            wait_idle(eng)
            ours = _run_ours(me, eng, a, work / f"ours-{rnd}", a.transport)
            runs.setdefault("ours", []).append(ours)
            ctx.expected_rps = max(ctx.expected_rps if rnd else 0.0, ours.engine_rps or 0.0)
            if a.also_transport:
                alt = f"ours-{a.also_transport}"
                wait_idle(eng)
                got_alt = _run_ours(me, eng, a, work / f"{alt}-{rnd}", a.also_transport, alt)
                runs.setdefault(alt, []).append(got_alt)
            if h2load is not None and FLOOR not in skipped:
                wait_idle(eng)
                floor = _run_floor(h2load, eng, a, work / f"{FLOOR}-{rnd}")
                if isinstance(floor, str):
                    skipped[FLOOR] = floor
                else:
                    runs.setdefault(FLOOR, []).append(floor)
            for name, venv in venvs.items():
                if name in skipped:
                    continue
                wait_idle(eng)
                got = _run_peer(name, venv, ctx, eng, a, work / f"{name}-{rnd}")
                if isinstance(got, str):
                    skipped[name] = got
                else:
                    runs.setdefault(name, []).append(got)
        # ---- TTFT error at each fraction of our ceiling (the same rate for --also-transport)
        ceiling = statistics.median(r.engine_rps or 0.0 for r in runs["ours"])
        ttft: list[tuple[str, float, float, dict[str, Any], Run]] = []
        for frac in a.ttft_fraction_list:
            rate = ceiling * frac
            for transport in (a.transport, a.also_transport):
                if transport is None:
                    continue
                wait_idle(eng)
                os.truncate(eng.ttft_log, 0)  # the engine appends (O_APPEND): this run's lines
                tdir = work / f"ours-ttft-{transport}-{round(frac * 100)}"
                tdir.mkdir(exist_ok=True)
                argv = [*me, "open", eng.url, str(a.ttft_duration_s), "1024", str(a.max_tokens),
                        str(rate), str(tdir / "records.jsonl"), transport]  # fmt: skip
                tr, rc = run_tool("ours-ttft", argv, eng, a.client_core, a.ttft_duration_s + 60,
                                  tdir / "log.txt")  # fmt: skip
                if rc != 0:
                    raise BenchError(f"the TTFT run ({transport}, {frac:g}) failed (exit {rc})")
                wait_idle(eng)
                terr = ttft_error(tdir / "records.jsonl", eng.ttft_log)
                ttft.append((transport, frac, rate, terr, tr))
    merged = [_median_run(name, rs) for name, rs in runs.items()]
    _report(merged, skipped, ttft, a)
    return 0


def _run_ours(
    me: list[str], eng: Engine, a: argparse.Namespace, out: Path, transport: str, row: str = "ours"
) -> Run:
    """One closed-loop run of our client (``run_load`` over ``transport``, records streamed to
    disk), shown as ``row``.

    Raises:
        BenchError: it failed or served too few requests.
    """
    out.mkdir(parents=True, exist_ok=True)
    argv = [*me, "closed", eng.url, str(a.duration_s), str(a.concurrency), str(a.max_tokens),
            "0", str(out / "records.jsonl"), transport]  # fmt: skip
    run, rc = run_tool(row, argv, eng, a.client_core, a.duration_s + 60, out / "log.txt")
    log = (out / "log.txt").read_text(errors="replace")
    if rc != 0 or run.engine_rps is None:
        raise BenchError(f"our client failed (exit {rc}): {log.strip()[-300:]}")
    summ = json.loads(log.strip().splitlines()[-1])
    run.own_rps = summ["ok_rps"]
    notes = [f"chunk path {summ.get('chunk_path') or 'python'}"]  # absent: before issue 24
    if summ["failed"]:
        notes.append(f"{summ['failed']} failed: {summ['errors_by_class']}")
    run.note = "; ".join(notes)
    (out / "records.jsonl").unlink(missing_ok=True)  # up to ~1 KB per request
    return run


def _run_peer(
    name: str, venv: Path, ctx: Ctx, eng: Engine, a: argparse.Namespace, out: Path
) -> Run | str:
    """One run of a peer; returns its figures, or the one-line reason it gave none."""
    peer = PEER_SPECS[name]
    out.mkdir(parents=True, exist_ok=True)
    print(f"running {name} ...", file=sys.stderr, flush=True)
    try:
        cmd = peer.command(ctx, venv, out)
    except OSError as exc:
        return f"could not prepare its run: {exc}"
    env = {**os.environ, **peer.env}
    run, rc = run_tool(name, cmd, eng, a.client_core, a.duration_s * 6 + 240, out / "log.txt",
                       env=env, cwd=out)  # fmt: skip
    text = (out / "log.txt").read_text(errors="replace")
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        run.own_rps = peer.own_rate(out, text)
    return _outcome(run, rc, text)


def _median_run(name: str, runs: list[Run]) -> Run:
    """Per-figure medians of one tool's runs; ``spread`` notes the req/core-s range."""

    def med(key: str) -> float | None:
        vals = [getattr(r, key) for r in runs if getattr(r, key) is not None]
        return statistics.median(vals) if vals else None

    out = Run(name, requests=sum(r.requests for r in runs))
    for key in ("own_rps", "engine_rps", "tokens_per_req", "cpu_util", "req_per_core_s",
                "window_s", "runq_share"):  # fmt: skip
        setattr(out, key, med(key))
    notes = sorted({r.note for r in runs if r.note})
    vals = [r.req_per_core_s for r in runs if r.req_per_core_s is not None]
    if len(vals) > 1:
        notes.insert(0, f"req/core-s {min(vals):.0f}-{max(vals):.0f} over {len(vals)} runs")
    out.note = "; ".join(notes)
    return out


def _report(
    runs: list[Run],
    skipped: dict[str, str],
    ttft: list[tuple[str, float, float, dict[str, Any], Run]],
    a: argparse.Namespace,
) -> None:
    head = (f"{'tool':<16}{'own req/s':>10}{'engine req/s':>13}{'tok/req':>8}{'client CPU':>11}"
            f"{'req/core-s':>11}{'window s':>9}{'runq wait':>10}  note")  # fmt: skip
    print(head)
    print("-" * len(head))
    for r in runs:
        cpu = "-" if r.cpu_util is None else f"{100 * r.cpu_util:.0f}%"
        runq = "-" if r.runq_share is None else f"{100 * r.runq_share:.0f}%"
        print(f"{r.tool:<16}{_fmt(r.own_rps):>10}{_fmt(r.engine_rps):>13}"
              f"{_fmt(r.tokens_per_req, '.1f'):>8}{cpu:>11}{_fmt(r.req_per_core_s):>11}"
              f"{_fmt(r.window_s, '.1f'):>9}{runq:>10}  {r.note}")  # fmt: skip
    for name, why in skipped.items():
        print(f"skipped {name}: {why}")
    ours = runs[0]
    peers = [r for r in runs if not r.tool.startswith("ours") and r.tool != FLOOR]
    floor = next((r for r in runs if r.tool == FLOOR), None)
    cost = math.nan
    if floor is not None and floor.req_per_core_s and ours.req_per_core_s:
        cost = floor.req_per_core_s / ours.req_per_core_s
        print(f"cost per request, ours / {FLOOR} (bare C client, HTTP/1.1, no stream parsing; "
              f"the floor of one client core): {cost:.2f}x (target <= 1.5x; "
              f"{ours.req_per_core_s:.0f} vs {floor.req_per_core_s:.0f} req per client "
              "core-second)")  # fmt: skip
    ratio = math.nan
    if peers:
        best_rps = max(peers, key=lambda r: r.engine_rps or 0)
        print(f"ratio engine req/s, ours / best peer ({best_rps.tool}): "
              f"{(ours.engine_rps or 0) / (best_rps.engine_rps or math.nan):.2f}")  # fmt: skip
        best = max(peers, key=lambda r: r.req_per_core_s or 0)
        if ours.req_per_core_s and best.req_per_core_s:
            ratio = ours.req_per_core_s / best.req_per_core_s
        print(f"ratio req per client core-second, ours / best peer ({best.tool}): {ratio:.2f} "
              "(target >= 1.5, aim 2)")  # fmt: skip
        for alt in runs[1:]:
            if alt.tool.startswith("ours") and alt.req_per_core_s and best.req_per_core_s:
                print(f"ratio req per client core-second, {alt.tool} / best peer ({best.tool}): "
                      f"{alt.req_per_core_s / best.req_per_core_s:.2f}")  # fmt: skip
    busy = [r.tool for r in runs if r.cpu_util is not None and r.cpu_util < 0.9]
    if busy:
        print(f"note: {', '.join(busy)} used < 90% of the client core: the one-core engine (or "
              "the box) capped it, so its req/s understates it; req/core-s is its capacity")  # fmt: skip
    shared = [r.tool for r in runs if r.runq_share is not None and r.runq_share > SHARED_RUNQ]
    if shared:
        print(f"WARNING: {', '.join(shared)} waited for a CPU over {SHARED_RUNQ:.0%} of its window: "
              "the machine was shared (a test run, another benchmark); a starved client reads "
              "late and the kernel merges segments, so these figures are not comparable with a "
              "quiet run's: run again with the box alone")  # fmt: skip
    print("runq wait: share of the window the client's processes were runnable but waited for "
        "their core, summed over processes (other work on this machine, and for a "
        "multi-process tool its own processes queueing for the one core); a high share "
        "from other work makes every figure, the TTFT tail most, noisy")  # fmt: skip
    ms = lambda v: _fmt(None if v is None else v * 1000, ".3f")  # noqa: E731
    for transport, frac, rate, terr, ttft_run in ttft:
        p99 = terr["p99_s"]
        verdict = "PASS" if p99 is not None and abs(p99) <= 0.001 else "FAIL"
        runq = None if ttft_run.runq_share is None else 100 * ttft_run.runq_share
        print(
            f"TTFT error, transport {transport}, at {frac:.0%} of our ceiling ({rate:.0f} req/s "
            f"Poisson, {a.ttft_duration_s:g} s, engine-counted {_fmt(ttft_run.engine_rps)} req/s, "
            f"client run-queue wait {_fmt(runq)}%; {terr['matched']} of {terr['ok']} ok requests "
            f"matched by id; truth: engine {terr['truth']} times, client kernel-timed "
            f"{terr['client_kernel']}): P50 {ms(terr['p50_s'])} ms, P99 {ms(p99)} ms, max "
            f"{ms(terr['max_s'])} ms (target |P99| <= 1 ms: {verdict}); P99 without the "
            f"{terr['fresh']} on new connections (connect in their TTFT) "
            f"{ms(terr['pooled_p99_s'])} ms; client TTFT P50/P99 {ms(terr['client_p50_s'])}/"
            f"{ms(terr['client_p99_s'])} ms, engine TTFT P50/P99 {ms(terr['server_p50_s'])}/"
            f"{ms(terr['server_p99_s'])} ms; client lag (kernel stamp to handling) P50/P99 "
            f"{ms(terr['lag_p50_s'])}/{ms(terr['lag_p99_s'])} ms"
        )
        print(
            f"TTFT error legs ({transport}, {frac:.0%}): send -> engine arrival P50/P99 "
            f"{ms(terr['up_p50_s'])}/{ms(terr['up_p99_s'])} ms; engine first token out -> our "
            f"first-token stamp P50/P99 {ms(terr['down_p50_s'])}/{ms(terr['down_p99_s'])} ms"
        )
    print(f"cost_vs_floor={cost:.3f}" if math.isfinite(cost) else "cost_vs_floor=nan")
    print(f"ratio_vs_best_peer={ratio:.3f}" if math.isfinite(ratio) else "ratio_vs_best_peer=nan")


if __name__ == "__main__":
    # SIGTERM unwinds like Ctrl-C: the engine and a running tool are stopped on the way out
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if len(sys.argv) > 1 and sys.argv[1] == "_ours":
        ours_main(sys.argv[2:])
        sys.exit(0)
    try:
        sys.exit(main())
    except BenchError as exc:
        print(f"client_ceiling: error: {exc}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
