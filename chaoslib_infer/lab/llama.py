"""Command lines for a real inference engine: ``llama_cpp.server`` (llama-cpp-python 0.3.x).

The lab runs replicas of ``python -m llama_cpp.server`` on a tiny random-weight model
(:mod:`chaoslib_infer.lab.gguf_model`), which gives a genuine OpenAI-compatible engine,
SSE streaming included, with no download and no GPU.

Facts about llama_cpp.server 0.3.36 that callers rely on (checked against the installed
package and by running it):

* The model is loaded *before* uvicorn binds the port, so once the port accepts
  connections the server is ready. There is **no** ``/health`` route (it answers 404);
  use ``GET /v1/models`` (:data:`READINESS_PATH`), which answers 200 with the alias.
* Requests are served one at a time (a global lock around the model). With the
  upstream default ``--interrupt_requests True`` a new request *cuts off* a stream in
  progress (it sends ``data: [DONE]`` early, then drops the connection before the end of
  the chunked body); :func:`llama_server_command` sets it to ``False`` so concurrent
  requests queue instead, like a real single-slot replica.
* ``max_tokens`` is capped at ``n_ctx`` minus the prompt (``finish_reason: "length"``).
* ``X-Request-ID`` is read by starlette-context's ``RequestIdPlugin``: it must be a
  UUID4 (anything else gets HTTP 400 with an empty body); it is echoed in the response's
  ``X-Request-ID`` header, and one (32 hex digits, no dashes) is generated when the
  request has none. The server
  emits no replica header. The replica id is put in the model alias (``--model_alias``),
  which ``GET /v1/models`` lists; completions echo the request's ``model`` field (or the
  model *path* when the request has none), and any ``model`` value is served by the one
  loaded model, so clients need not know the alias.
* Boolean flags take a value (``--verbose False``), parsed from 1/0, true/false, yes/no,
  on/off.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Final

__all__ = [
    "DEFAULT_MODEL_ALIAS",
    "INSTALL_HINT",
    "READINESS_PATH",
    "LlamaUnavailable",
    "llama_available",
    "llama_engine_command",
    "llama_server_command",
    "model_alias_for",
    "require_llama",
]

#: GET path that answers 200 once a ``llama_cpp.server`` replica can serve requests.
READINESS_PATH: Final = "/v1/models"

#: Model name prefix; the served alias is ``f"{DEFAULT_MODEL_ALIAS}@{replica_id}"``.
DEFAULT_MODEL_ALIAS: Final = "tiny-llama"

#: Modules ``python -m llama_cpp.server`` needs: the engine and the server extra.
_SERVER_MODULES: Final = (
    "llama_cpp",
    "fastapi",
    "uvicorn",
    "sse_starlette",
    "starlette_context",
    "pydantic_settings",
)

INSTALL_HINT: Final = (
    "llama-cpp-python is not installed (it is an sdist only: pip compiles llama.cpp, "
    "~7 minutes on 2 cores). Build the wheel once and install it with "
    "`scripts/build-llama-wheel.sh --install` (the wheel is kept in "
    "${CHAOS_INFER_WHEELS:-~/.cache/chaoslib-infer/wheels}), or see the README quickstart: "
    'pip install --find-links ~/.cache/chaoslib-infer/wheels "llama-cpp-python[server]==0.3.36".'
)

# Flags tuned for a 2-core machine with a tiny model. Values are strings as they go on
# the command line; booleans use the "True"/"False" spelling llama_cpp.server parses.
_DEFAULT_FLAGS: Final[Mapping[str, str]] = {
    "n_ctx": "2048",  # the model's context; KV cache is ~0.5 MB, start time unchanged
    "n_batch": "128",
    "n_ubatch": "128",
    "n_threads": "1",  # one core per replica; the other runs the load client
    "n_threads_batch": "1",  # upstream default is 2
    "n_gpu_layers": "0",
    "use_mlock": "False",  # upstream default True fails without CAP_IPC_LOCK
    "logits_all": "False",  # upstream default True keeps logits for every token
    "interrupt_requests": "False",  # queue concurrent requests instead of cutting streams
    "verbose": "False",  # True prints llama.cpp load logs and per-request timings
    "seed": "0",
}


class LlamaUnavailable(RuntimeError):
    """Raised when llama-cpp-python (or its server extra) is not installed."""

    def __init__(self, missing: str | None = None) -> None:
        detail = f" (missing module: {missing})" if missing else ""
        super().__init__(INSTALL_HINT + detail)
        self.missing = missing


def _missing_module() -> str | None:
    for name in _SERVER_MODULES:
        try:
            if importlib.util.find_spec(name) is None:
                return name
        except (ImportError, ValueError):
            return name
    return None


def llama_available() -> bool:
    """Return whether ``python -m llama_cpp.server`` can run in this interpreter.

    Checks that ``llama_cpp`` and the server extra's modules are importable, without
    importing them (importing ``llama_cpp`` loads the native library).
    """
    return _missing_module() is None


def require_llama() -> None:
    """Raise :class:`LlamaUnavailable` with install instructions unless llama is available."""
    missing = _missing_module()
    if missing is not None:
        raise LlamaUnavailable(missing)


def model_alias_for(replica_id: str) -> str:
    """Return the model alias a replica serves under: ``tiny-llama@<replica_id>``."""
    return f"{DEFAULT_MODEL_ALIAS}@{replica_id}"


def _flag_value(value: object) -> str:
    if isinstance(value, bool):
        return "True" if value else "False"
    return str(value)


def llama_server_command(
    model_path: Path | str,
    host: str = "127.0.0.1",
    port: int = 8000,
    replica_id: str = "r0",
    extra: Mapping[str, object] | None = None,
    *,
    check: bool = True,
) -> list[str]:
    """Return the argv that starts one ``llama_cpp.server`` replica.

    The command is ``[sys.executable, "-m", "llama_cpp.server", "--model", PATH,
    "--host", HOST, "--port", PORT, "--model_alias", "tiny-llama@REPLICA", "--n_ctx",
    "2048", "--n_batch", "128", "--n_ubatch", "128", "--n_threads", "1",
    "--n_threads_batch", "1", "--n_gpu_layers", "0", "--use_mlock", "False",
    "--logits_all", "False", "--interrupt_requests", "False", "--verbose", "False",
    "--seed", "0"]``, then any ``extra`` flags.

    Args:
        model_path: The GGUF model file.
        host: Listen address (keep it on loopback for tests).
        port: Listen port.
        replica_id: Identifies the replica; served as the model alias
            ``tiny-llama@<replica_id>`` (listed by ``GET /v1/models``).
        extra: More ``llama_cpp.server`` flags, without the leading ``--``
            (e.g. ``{"n_ctx": 1024, "verbose": True}``). A key that matches a default
            flag replaces it (including ``model_alias``); a ``None`` value drops that
            default flag. Booleans become ``True``/``False``. Flags are not validated
            here; ``llama_cpp.server`` rejects unknown ones.
        check: Raise :class:`LlamaUnavailable` if llama-cpp-python is not installed.

    Returns:
        The argv list, ready for :class:`subprocess.Popen` or a supervisord program.

    Raises:
        LlamaUnavailable: If ``check`` and llama-cpp-python or its server extra is missing.
        ValueError: If ``port`` is out of range or ``host``/``replica_id`` is empty.
    """
    if check:
        require_llama()
    if not 0 < int(port) < 65536:
        raise ValueError(f"port out of range: {port}")
    if not host or not replica_id:
        raise ValueError("host and replica_id must be non-empty")

    flags: dict[str, str | None] = {"model_alias": model_alias_for(replica_id)}
    flags.update(_DEFAULT_FLAGS)
    for key, value in (extra or {}).items():
        name = key.removeprefix("--")
        if name in {"model", "host", "port"}:
            raise ValueError(f"pass {name!r} as an argument, not in extra")
        flags[name] = None if value is None else _flag_value(value)

    argv = [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        str(model_path),
        "--host",
        host,
        "--port",
        str(int(port)),
    ]
    for name, value in flags.items():
        if value is not None:
            argv += [f"--{name}", value]
    return argv


def llama_engine_command(
    replica: str, port: int, ledger: Path, engine_args: dict[str, object]
) -> list[str]:
    """Build a replica's argv with the lab's engine-builder signature.

    Matches ``chaoslib_infer.lab.fleet.EngineBuilder``, so the fleet can do
    ``register_engine("llama-cpp", llama_engine_command)``. The replica listens on
    127.0.0.1:``port``; readiness is ``GET`` :data:`READINESS_PATH` (there is no
    ``/health``).

    Args:
        replica: Replica id (served as the model alias).
        port: Loopback port.
        ledger: The sim engine's request ledger; llama_cpp.server keeps none, so it is
            ignored.
        engine_args: Optional ``model`` (a GGUF path; default: the cached tiny model from
            :func:`chaoslib_infer.lab.gguf_model.ensure_tiny_model`), ``model_seed`` and
            ``model_cache_dir`` for that model; every other key is passed to
            :func:`llama_server_command` as an ``extra`` flag.

    Raises:
        LlamaUnavailable: If llama-cpp-python or its server extra is missing.
    """
    del ledger  # no per-request ledger in llama_cpp.server
    import dataclasses

    from chaoslib_infer.lab.engine import EngineConfig

    # a plan's engine_args are written for the sim engine (e.g. max_num_seqs): llama_cpp.server
    # would refuse them, so the sim engine's own options are left out here
    sim_only = {f.name for f in dataclasses.fields(EngineConfig)}
    args = {k: v for k, v in engine_args.items() if k not in sim_only}
    model = args.pop("model", None)
    seed = args.pop("model_seed", 0)
    cache_dir = args.pop("model_cache_dir", None)
    require_llama()
    if model is None:
        from chaoslib_infer.lab.gguf_model import ensure_tiny_model

        model = ensure_tiny_model(
            Path(str(cache_dir)) if cache_dir is not None else None, seed=int(str(seed))
        )
    return llama_server_command(Path(str(model)), "127.0.0.1", port, replica, args)
