"""The engine's command line: flags, their check for the lab, and :func:`main` (serve)."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import socket
import sys
from pathlib import Path
from typing import NoReturn

from chaoslib_infer.lab import kernel_stamps
from chaoslib_infer.lab.engine.app import build_app
from chaoslib_infer.lab.engine.config import EngineConfig


def _tune_malloc() -> None:
    """Fix glibc's mmap threshold so freed KV blocks go back to the OS (Linux/glibc only)."""
    with contextlib.suppress(Exception):
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD; also disables the dynamic threshold


class _CheckingParser(argparse.ArgumentParser):
    """An argument parser whose errors raise ``ValueError`` instead of exiting (``check_args``)."""

    def error(self, message: str) -> NoReturn:
        raise ValueError(message)


def check_args(argv: list[str]) -> None:
    """Check engine flags without starting anything (the lab does, before it starts a replica).

    ``--admin-token-file`` is not read.

    Args:
        argv: the flags (an engine command line after ``-m chaoslib_infer.lab.engine``).

    Raises:
        ValueError: an unknown flag or a value the engine would refuse (argparse's or
            :class:`EngineConfig`'s message, one line).
    """
    p = _build_parser(_CheckingParser)
    a = p.parse_args(argv)
    _config(a, p, admin_token=None)


def parse_args(argv: list[str] | None = None) -> EngineConfig:
    """Parse CLI flags into an :class:`EngineConfig`.

    Args:
        argv: arguments (default ``sys.argv[1:]``).

    Returns:
        The configuration.

    Raises:
        SystemExit: on invalid flags (argparse), an unreadable ``--admin-token-file`` or a token
            shorter than 16 characters.
    """
    p = _build_parser(argparse.ArgumentParser)
    a = p.parse_args(argv)
    admin_token: str | None = None
    if a.admin_token_file is not None:
        try:
            lines = a.admin_token_file.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            p.error(f"--admin-token-file {a.admin_token_file}: cannot read it: {exc}")
        admin_token = lines[0].strip() if lines else ""
        if len(admin_token) < 16:
            p.error(f"--admin-token-file {a.admin_token_file}: needs a token of 16+ characters")
    return _config(a, p, admin_token)


def _build_parser(cls: type[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    d = EngineConfig()
    p = cls(
        prog="python -m chaoslib_infer.lab.engine",
        description="Simulated vLLM-like OpenAI-compatible inference server for the chaos lab.",
    )
    p.add_argument("--host", default=d.host)
    p.add_argument("--port", type=int, default=d.port, help="0 picks a free port (logged)")
    p.add_argument("--replica-id", default=d.replica_id)
    p.add_argument("--ledger", type=Path, default=None, help="generation ledger (JSON lines)")
    p.add_argument("--model", default=d.model)
    p.add_argument("--load-delay-s", type=float, default=d.load_delay_s)
    p.add_argument("--warmup-requests", type=int, default=d.warmup_requests)
    p.add_argument("--warmup-penalty-s", type=float, default=d.warmup_penalty_s)
    p.add_argument("--prefill-s-per-token", type=float, default=d.prefill_s_per_token)
    p.add_argument("--itl-s", type=float, default=d.itl_s)
    p.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs)
    p.add_argument("--max-waiting", type=int, default=d.max_waiting)
    p.add_argument("--queue-full-status", type=int, choices=(429, 503), default=d.queue_full_status)
    p.add_argument("--kv-bytes-per-token", type=int, default=d.kv_bytes_per_token)
    p.add_argument("--kv-cache-tokens", type=int, default=d.kv_cache_tokens)
    p.add_argument("--zero-latency", action="store_true", help="no delays at all")
    p.add_argument("--output-tokens", type=int, default=d.output_tokens)
    p.add_argument("--graceful-shutdown-s", type=float, default=d.graceful_shutdown_s)
    p.add_argument(
        "--no-admin-faults",
        dest="admin_faults",
        action="store_false",
        help="disable the lab-only /admin/faults endpoint and the X-Chaos-Fault header",
    )
    p.add_argument(
        "--admin-token-file", type=Path, default=None, metavar="FILE",
        help="lab admin token (first line of FILE): /admin/faults and X-Chaos-Fault then need "
        "it in X-Chaos-Admin-Token from every peer (default: loopback peers only)",
    )  # fmt: skip
    p.add_argument(
        "--profile", choices=("vllm", "sglang", "tgi", "trtllm", "ark", "openai"),
        default=d.profile, help="answer like this provider (routes, auth, error shapes, stream "
        "chunks; chaoslib_infer.lab.mimic); key from $CHAOS_INFER_ENGINE_API_KEY",
    )  # fmt: skip
    p.add_argument(
        "--ttft-log", type=Path, default=None,
        help="append one JSON line per first token: request_id, server-side ttft_s, t (unix s), "
        "and kernel times of request in / first token out (rx_at, tx_at, ttft_kernel_s: "
        "chaoslib_infer.lab.kernel_stamps)",
    )  # fmt: skip
    p.add_argument(
        "--fault-state-dir", type=Path, default=None, metavar="DIR",
        help="keep armed crash faults (crash_on_long_prompt) in DIR/<replica-id>.json and re-arm "
        "them at start, like a deterministic bug that survives a restart (the lab sets it)",
    )  # fmt: skip
    return p


def _config(
    a: argparse.Namespace, p: argparse.ArgumentParser, admin_token: str | None
) -> EngineConfig:
    try:
        return EngineConfig(
            host=a.host,
            port=a.port,
            replica_id=a.replica_id,
            ledger=a.ledger,
            model=a.model,
            load_delay_s=a.load_delay_s,
            warmup_requests=a.warmup_requests,
            warmup_penalty_s=a.warmup_penalty_s,
            prefill_s_per_token=a.prefill_s_per_token,
            itl_s=a.itl_s,
            max_num_seqs=a.max_num_seqs,
            max_waiting=a.max_waiting,
            queue_full_status=a.queue_full_status,
            kv_bytes_per_token=a.kv_bytes_per_token,
            kv_cache_tokens=a.kv_cache_tokens,
            zero_latency=a.zero_latency,
            output_tokens=a.output_tokens,
            graceful_shutdown_s=a.graceful_shutdown_s,
            admin_faults=a.admin_faults,
            admin_token=admin_token,
            profile=a.profile,
            ttft_log=a.ttft_log,
            fault_state_dir=a.fault_state_dir,
        )
    except ValueError as exc:
        p.error(str(exc))
        raise  # unreachable: p.error exits


def main(argv: list[str] | None = None) -> None:
    """Run the engine until SIGTERM/SIGINT.

    Logs one line to stderr once the socket is bound:
    ``lab-engine listening replica=R pid=P host=H port=N model=M load_delay_s=S``.

    Args:
        argv: CLI arguments (default ``sys.argv[1:]``).

    Raises:
        SystemExit: on invalid flags; OSError when the port cannot be bound.
    """
    import uvicorn

    config = parse_args(argv)
    _tune_malloc()
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((config.host, config.port))
    sock.set_inheritable(True)
    port = sock.getsockname()[1]
    app = build_app(config)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            loop="uvloop",
            http=kernel_stamps.protocol_class() if config.ttft_log is not None else "httptools",
            access_log=False,
            log_level="warning",
            lifespan="on",
            timeout_graceful_shutdown=math.ceil(config.graceful_shutdown_s),
        )
    )
    print(
        f"lab-engine listening replica={config.replica_id} pid={os.getpid()} "
        f"host={config.host} port={port} model={config.model} "
        f"load_delay_s={config.load_delay_s}",
        file=sys.stderr,
        flush=True,
    )
    server.run(sockets=[sock])
