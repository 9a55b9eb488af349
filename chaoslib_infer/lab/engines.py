"""Engine commands of the lab's replicas (pluggable: the llama.cpp engine registers ``llama-cpp``).

:func:`engine_command` is the argv supervisord runs for one replica; :func:`register_engine` adds an
engine (``Lab.up(engine=name)``). A leaf module, re-exported by :mod:`chaoslib_infer.lab.fleet`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from chaoslib_infer.lab.statedir import LabError

__all__ = [
    "ENGINES",
    "HEALTH_PATHS",
    "EngineBuilder",
    "check_sim_args",
    "cli_args",
    "engine_command",
    "health_path",
    "register_engine",
]

EngineBuilder = Callable[[str, int, Path, dict[str, object]], list[str]]


def cli_args(engine_args: dict[str, object]) -> list[str]:
    """``{"load_delay_s": 1.0, "zero_latency": True}`` -> ``["--load-delay-s", "1.0", "--zero-latency"]``."""
    out: list[str] = []
    for key, value in engine_args.items():
        flag = "--" + key.replace("_", "-").lstrip("-")
        if value is None or value is False:
            continue
        if value is True:
            out.append(flag)
        elif isinstance(value, list | tuple):
            for item in value:
                out += [flag, str(item)]
        else:
            out += [flag, str(value)]
    return out


def _sim_command(
    replica: str, port: int, ledger: Path, engine_args: dict[str, object]
) -> list[str]:
    return [
        sys.executable, "-m", "chaoslib_infer.lab.engine",
        "--host", "127.0.0.1", "--port", str(port), "--replica-id", replica,
        "--ledger", str(ledger), *cli_args(engine_args),
    ]  # fmt: skip


ENGINES: dict[str, EngineBuilder] = {"sim": _sim_command}
HEALTH_PATHS: dict[str, str] = {"sim": "/health"}


def register_engine(name: str, builder: EngineBuilder, health_path: str = "/health") -> None:
    """Make ``engine=name`` available to :meth:`Lab.up`.

    Args:
        name: engine name (``Lab.up(engine=name)``, ``Lab.engine_name()``).
        builder: ``builder(replica, port, ledger, engine_args) -> argv``; the server must listen
            on 127.0.0.1:``port``.
        health_path: GET path answering 200 once the replica serves (HAProxy ``httpchk``,
            readiness, the recorder's ``ready`` event).
    """
    ENGINES[name] = builder
    HEALTH_PATHS[name] = health_path


def _register_builtin_engines() -> None:
    """Register ``llama-cpp`` from :mod:`chaoslib_infer.lab.llama` when that module exists."""
    if "llama-cpp" in ENGINES:
        return
    try:
        from chaoslib_infer.lab import llama
    except ImportError:
        return
    register_engine("llama-cpp", llama.llama_engine_command, llama.READINESS_PATH)


def health_path(engine: str) -> str:
    """GET path that answers 200 when a replica of ``engine`` is ready."""
    _register_builtin_engines()
    return HEALTH_PATHS.get(engine, "/health")


def engine_command(
    engine: str,
    replica: str,
    port: int,
    ledger: Path,
    engine_args: dict[str, object] | None = None,
) -> list[str]:
    """argv of one replica's engine server listening on 127.0.0.1:``port``.

    Raises:
        LabError: unknown engine.
    """
    _register_builtin_engines()
    builder = ENGINES.get(engine)
    if builder is None:
        raise LabError(f"unknown engine {engine!r}; known: {', '.join(sorted(ENGINES))}")
    try:
        return builder(replica, port, ledger, dict(engine_args or {}))
    except LabError:
        raise
    except (RuntimeError, OSError, ValueError, TypeError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise LabError(f"engine {engine!r}: {first}") from exc


#: sim engine flags the lab sets itself (an ``engine_args`` key for one is refused)
LAB_SET_ARGS = ("host", "port", "replica_id", "ledger", "admin_token_file", "fault_state_dir")


def check_sim_args(engine_args: dict[str, object], argv: list[str]) -> None:
    """Refuse sim ``engine_args`` the engine would reject, before anything starts.

    Raises:
        LabError: a key the lab sets itself, an unknown flag or a bad value (one line).
    """
    taken = [k for k in engine_args if str(k).replace("-", "_").lstrip("_") in LAB_SET_ARGS]
    if taken:
        raise LabError(f"engine_args: {taken[0]!r} is set by the lab, not by engine_args")
    from chaoslib_infer.lab import engine as sim  # heavy (the web stack): only when checked

    try:
        sim.check_args(argv[argv.index("chaoslib_infer.lab.engine") + 1 :])
    except ValueError as exc:
        raise LabError(f"engine_args {engine_args}: {exc}") from None
