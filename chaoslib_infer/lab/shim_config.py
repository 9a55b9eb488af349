"""The jitter shim's configuration (:class:`ShimConfig`) and the parser of its command line
(``python -m chaoslib_infer.lab.shim``, :func:`config_from_args`).

Split out of :mod:`chaoslib_infer.lab.shim` (its docstring lists the options and what they
mean), which re-exports these names (import paths kept).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from chaoslib_infer.lab.jitter import DISTRIBUTIONS

__all__ = ["DRAIN_S", "SHIM_MODULE", "ShimConfig", "build_parser", "config_from_args"]

SHIM_MODULE = "chaoslib_infer.lab.shim"
#: seconds a response in flight at removal may take to finish before it is reset
DRAIN_S = 10.0
#: the shim's ``--help`` description: the first line of :mod:`chaoslib_infer.lab.shim`'s docstring
DESCRIPTION = "Stream-level network jitter for kernels without ``netem``: a delaying TCP proxy."


@dataclass
class ShimConfig:
    """Everything one shim process needs (see the module docstring). Times in seconds."""

    upstream_host: str
    upstream_port: int
    delay_s: float
    jitter_s: float
    listen_host: str = "127.0.0.1"
    listen_port: int = 0
    loss: float = 0.0
    distribution: str = "normal"
    seed: int | None = None
    ttl_s: float = 60.0
    drain_s: float = DRAIN_S
    stats_path: Path | None = None
    events_path: Path | None = None
    haproxy_sock: Path | None = None
    backend: str | None = None
    server: str | None = None
    detour: str | None = None
    label: str = ""


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------
def _hostport(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return host, int(port)


def build_parser() -> argparse.ArgumentParser:
    """Argument parser of ``python -m chaoslib_infer.lab.shim``."""
    p = argparse.ArgumentParser(prog=f"python -m {SHIM_MODULE}", description=DESCRIPTION)
    p.add_argument("--upstream", type=_hostport, required=True, help="HOST:PORT to forward to")
    p.add_argument("--listen", type=_hostport, default=("127.0.0.1", 0), help="HOST:PORT (port 0)")
    p.add_argument("--delay-ms", type=float, required=True, help="mean delay per chunk, ms")
    p.add_argument("--jitter-ms", type=float, default=0.0, help="jitter (normal: sigma), ms")
    p.add_argument("--loss-pct", type=float, default=0.0, help="chunk loss (connection reset), %%")
    p.add_argument("--distribution", choices=DISTRIBUTIONS, default="normal")
    p.add_argument("--seed", type=int, default=None, help="RNG seed (default random)")
    p.add_argument("--ttl-s", type=float, default=60.0, help="dead-man switch: exit after, s")
    p.add_argument(
        "--drain-s",
        type=float,
        default=DRAIN_S,
        help="at stop, seconds a response in flight may take to finish before it is reset",
    )
    p.add_argument("--stats", type=Path, default=None, help="stats JSON file")
    p.add_argument("--events", type=Path, default=None, help="lab events.jsonl (restore events)")
    p.add_argument("--haproxy-sock", type=Path, default=None, help="HAProxy admin socket")
    p.add_argument("--server", default=None, help="BACKEND/SERVER to restore at stop")
    p.add_argument("--detour", default=None, help="the run-time server routing to this shim")
    p.add_argument("--label", default="", help="free text recorded in stats and events")
    return p


def config_from_args(argv: list[str] | None = None) -> ShimConfig:
    """Parse the CLI into a :class:`ShimConfig` (argparse exits 2 on bad input)."""
    p = build_parser()
    a = p.parse_args(argv)
    backend = server = None
    if a.server:
        backend, _, server = a.server.partition("/")
        if not backend or not server:
            p.error(f"--server must be BACKEND/SERVER, got {a.server!r}")
    if not 0 <= a.loss_pct <= 100:
        p.error(f"--loss-pct must be 0..100, got {a.loss_pct}")
    if a.delay_ms < 0 or a.jitter_ms < 0 or a.ttl_s <= 0 or a.drain_s < 0:
        p.error("--delay-ms, --jitter-ms, --drain-s must be >= 0 and --ttl-s > 0")
    return ShimConfig(
        upstream_host=a.upstream[0],
        upstream_port=a.upstream[1],
        listen_host=a.listen[0],
        listen_port=a.listen[1],
        delay_s=a.delay_ms / 1000.0,
        jitter_s=a.jitter_ms / 1000.0,
        loss=a.loss_pct / 100.0,
        distribution=a.distribution,
        seed=a.seed,
        ttl_s=a.ttl_s,
        drain_s=a.drain_s,
        stats_path=a.stats,
        events_path=a.events,
        haproxy_sock=a.haproxy_sock,
        backend=backend,
        server=server,
        detour=a.detour,
        label=a.label,
    )
