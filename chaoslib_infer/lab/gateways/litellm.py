"""LiteLLM's proxy as the lab's gateway (``Lab.up(gateway="litellm")``): config, lanes, program.

What the lab starts: ``litellm --config STATE/litellm.yaml --host 127.0.0.1 --port PORT
--num_workers 1`` under supervisord (program ``gateway``), from its own virtualenv (LiteLLM pins
packages under the project's; ``scripts/quickstart litellm`` installs it into
``~/.cache/chaoslib-infer/litellm-venv``; ``CHAOS_INFER_LITELLM`` names another executable). It
runs offline (``LITELLM_LOCAL_MODEL_COST_MAP=True``: no model-cost download), without a
database, and without a master key (``LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY``: it
listens on loopback only; a config that sets ``master_key`` or ``database_url`` is refused).

**Lanes.** Each deployment of LiteLLM's ``model_list`` reaches one replica through its *lane*:
a HAProxy frontend + backend pair on a loopback port of its own (HTTP mode, no health checks, no
retries, no queue: LiteLLM's timeouts, retries and cooldowns decide, not HAProxy's), so that

- the drills' steps still act where they act on every lab: on HAProxy's runtime socket (a
  replica in maintenance, the jitter detour, a move to the spare node); ``gateway-sync`` mirrors
  each replica's servers of backend ``engines`` (``rX`` and its detours ``rX-*``: address,
  port, admin state) into lane ``rX`` (:func:`lane_commands`), which is what a Kubernetes
  Service does for the pods behind one LiteLLM deployment;
- every upstream try LiteLLM makes is a line of the lab's request log (the lane's HAProxy
  line: replica, status, timings and the ``X-Request-Id`` LiteLLM forwards; the lab sets
  ``general_settings.forward_client_headers_to_llm_api: true`` for that), the ground truth the
  drills read on every lab.

A lane whose replica is in maintenance answers 503 at once; a killed replica's lane gives
LiteLLM the refused connection as a 503 (HAProxy ``SC`` termination): LiteLLM sees an endpoint
that is gone and its retries, ``allowed_fails`` and ``cooldown_time`` decide what the client
sees. LiteLLM's ``model_list`` is static without its database: a replica the autoscaler puts in
service later is not in it unless the config lists its lane (``all_replicas``) or routes a
deployment through ``service`` (the lab's HAProxy frontend over every replica in service: the
analogue of a Kubernetes Service).

**Config** (``gateway_config``): the user's LiteLLM proxy config, a Jinja2 template
(``StrictUndefined``) rendered with ``model`` (``sim``: the model name the drills' client
sends), ``replicas`` (the replicas in service at start: ``[{"name", "api_base"}]``, api_base
``http://127.0.0.1:LANE/v1``), ``all_replicas`` (with the standby ones), ``service``
(``http://127.0.0.1:PORT/v1``), ``model_list`` (the lab's default list: one deployment per
replica in service, ``model: openai/sim``) and ``lab_id``; then read as YAML. A config without
``model_list`` gets the lab's. Without a config the lab uses
``templates/litellm-default.yaml`` (LiteLLM's defaults: ``num_retries`` 0, no timeout set).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from chaoslib_infer.errors import InferChaosError
from chaoslib_infer.lab.gateways.templating import render
from chaoslib_infer.safety.redact import child_env

__all__ = [
    "CONFIG_FILE",
    "ENV_BINARY",
    "LiteLLMError",
    "MODEL",
    "find_litellm",
    "lane_commands",
    "lanes_config",
    "program_command",
    "program_environment",
    "render_config",
    "routed_replicas",
    "version",
]

CONFIG_FILE = "litellm.yaml"
#: environment variable naming the ``litellm`` executable to use
ENV_BINARY = "CHAOS_INFER_LITELLM"
#: model name the drills' client sends (``LoadSpec.model``)
MODEL = "sim"
VENV_BINARY = Path.home() / ".cache" / "chaoslib-infer" / "litellm-venv" / "bin" / "litellm"
_REFUSED_SETTINGS = ("master_key", "database_url")
#: HAProxy admin-state bits (``srv_admin_state``, ``SRV_ADMF_*`` of src/server.h): maintenance
#: (forced, inherited, config ``disabled``, resolution, hostname) and drain (forced, inherited)
_MAINT_BITS, _DRAIN_BITS = 0x01 | 0x02 | 0x04 | 0x20 | 0x40, 0x08 | 0x10


class LiteLLMError(InferChaosError):
    """A LiteLLM config (or install) the lab refuses; the message is one line."""


def find_litellm() -> str | None:
    """The ``litellm`` executable: ``$CHAOS_INFER_LITELLM``, the project's LiteLLM virtualenv
    (``$CHAOS_INFER_LITELLM_VENV``, default ``~/.cache/chaoslib-infer/litellm-venv``: where
    ``scripts/quickstart litellm`` installs it), then ``litellm`` on PATH; None when none is."""
    named = os.environ.get(ENV_BINARY)
    if named:
        return named if Path(named).is_file() else None
    venv = os.environ.get("CHAOS_INFER_LITELLM_VENV")
    binary = Path(venv) / "bin" / "litellm" if venv else VENV_BINARY
    if binary.is_file():
        return str(binary)
    return shutil.which("litellm")


def _lane_url(port: int) -> str:
    return f"http://127.0.0.1:{int(port)}/v1"


def default_model_list(replicas: list[dict[str, str]]) -> list[dict[str, Any]]:
    """One deployment per replica: ``model_name`` :data:`MODEL`, ``litellm_params`` ``model:
    openai/sim``, the replica's lane as ``api_base`` and a placeholder ``api_key``."""
    return [
        {
            "model_name": MODEL,
            "litellm_params": {
                "model": f"openai/{MODEL}",
                "api_base": r["api_base"],
                "api_key": "none",
            },
            "model_info": {"id": f"lab-{r['name']}"},
        }
        for r in replicas
    ]


def render_config(
    user_config: str | None,
    lanes: dict[str, int],
    in_service: list[str],
    service_port: int,
    lab_id: str,
    source: str = "gateway_config",
) -> str:
    """Render the proxy config LiteLLM starts with (module docstring, "Config").

    Args:
        user_config: the user's config text (a Jinja2 template of YAML), None for the default.
        lanes: replica name -> its lane's port, every replica (standby ones too).
        in_service: the replicas in service at start (the default ``model_list``'s).
        service_port: the port of the lab's HAProxy frontend (``service``).
        lab_id: the lab's id.
        source: what to call the config in an error (its path).

    Returns:
        The YAML text: the user's settings, ``model_list`` (the lab's when the config has
        none) and ``general_settings.forward_client_headers_to_llm_api: true``.

    Raises:
        LiteLLMError: a template error, YAML that does not parse or is not a mapping, a
            ``model_list`` that is not a list of deployments with ``litellm_params.model``, no
            deployment named :data:`MODEL`, or ``master_key`` / ``database_url`` set.
    """
    all_reps = [{"name": n, "api_base": _lane_url(p)} for n, p in sorted(lanes.items())]
    reps = [r for r in all_reps if r["name"] in set(in_service)]
    variables: dict[str, Any] = {
        "model": MODEL,
        "replicas": reps,
        "all_replicas": all_reps,
        "service": _lane_url(service_port),
        "model_list": yaml.safe_dump(default_model_list(reps), sort_keys=False).rstrip(),
        "lab_id": lab_id,
    }
    text = render(user_config, "litellm-default.yaml.j2", variables, source, LiteLLMError)
    try:
        cfg = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise LiteLLMError(f"{source}{where}: not valid YAML: {problem}") from None
    if cfg is None:
        cfg = {}
    if not isinstance(cfg, dict):
        raise LiteLLMError(
            f"{source}: a LiteLLM proxy config is a mapping, got {type(cfg).__name__}"
        )
    models = cfg.setdefault("model_list", default_model_list(reps))
    if not isinstance(models, list) or not all(
        isinstance(m, dict)
        and isinstance(m.get("litellm_params"), dict)
        and m["litellm_params"].get("model")
        for m in models
    ):
        raise LiteLLMError(
            f"{source}: model_list must be a list of deployments, each with litellm_params.model"
        )
    if not any(m.get("model_name") == MODEL for m in models):
        raise LiteLLMError(
            f"{source}: no deployment has model_name {MODEL!r}, the model the drills' client "
            "asks for"
        )
    general = cfg.setdefault("general_settings", {})
    if general is None:
        general = cfg["general_settings"] = {}
    if not isinstance(general, dict):
        raise LiteLLMError(f"{source}: general_settings must be a mapping")
    for key in _REFUSED_SETTINGS:
        if general.get(key) is not None:
            raise LiteLLMError(
                f"{source}: sets general_settings.{key}: the lab's LiteLLM runs on loopback "
                "without auth or database; remove it"
            )
    general["forward_client_headers_to_llm_api"] = True  # X-Request-Id reaches the lanes
    return yaml.safe_dump(cfg, sort_keys=False)


def routed_replicas(config: Path, lanes: dict[str, int]) -> list[str]:
    """The replicas whose lane a deployment of the rendered proxy config ``config`` names (by
    its ``api_base`` port), sorted; ``[]`` when the file cannot be read."""
    try:
        cfg = yaml.safe_load(Path(config).read_text())
    except (OSError, yaml.YAMLError):
        return []
    bases = {
        str((m.get("litellm_params") or {}).get("api_base") or "")
        for m in (cfg or {}).get("model_list") or []
        if isinstance(m, dict)
    }
    return sorted(n for n, p in lanes.items() if _lane_url(int(p)) in bases)


def lanes_config(lanes: dict[str, int], servers: dict[str, tuple[str, int, bool]]) -> str:
    """The haproxy.cfg sections of the lanes (module docstring, "Lanes").

    Args:
        lanes: replica name -> its lane's port on 127.0.0.1.
        servers: replica name -> ``(host, port, standby)``: the replica's address, and whether
            it starts out of service (its lane server starts ``disabled``, as in ``engines``).

    Returns:
        ``frontend lane_rX`` / ``backend lane_rX`` pairs: ``X-Request-Id`` captured for the
        log, ``retries 0``, no redispatch, ``timeout server 1h`` (LiteLLM's timeouts decide),
        ``option abortonclose`` (when LiteLLM gives up on a try, the lane drops it at once and
        logs it: without it a try to a frozen replica is logged only when the replica answers,
        or never), one server ``rX`` without health checks.
    """
    out = []
    for name in sorted(lanes):
        host, port, standby = servers[name]
        out.append(
            f"frontend lane_{name}\n"
            f"    bind 127.0.0.1:{int(lanes[name])}\n"
            "    capture request header X-Request-Id len 64\n"
            f"    default_backend lane_{name}\n\n"
            f"backend lane_{name}\n"
            "    balance roundrobin\n"
            "    retries 0\n"
            "    no option redispatch\n"
            "    option abortonclose\n"
            "    timeout server 1h\n"
            "    timeout queue 1s\n"
            "    http-response set-header X-Lab-Server %s\n"
            f"    server {name} {host}:{int(port)}{' disabled' if standby else ''}\n"
        )
    return "\n".join(out)


def _admin(row: dict[str, str]) -> int:
    try:
        return int(row.get("srv_admin_state", "0"))
    except ValueError:
        return 0


def _state(row: dict[str, str]) -> str:
    admin = _admin(row)
    if admin & _MAINT_BITS:
        return "maint"
    return "drain" if admin & _DRAIN_BITS else "ready"


def lane_commands(
    engines: dict[str, dict[str, str]], lanes: dict[str, dict[str, dict[str, str]]]
) -> list[str]:
    """HAProxy runtime commands that make each lane mirror its replica's servers of ``engines``.

    Args:
        engines: ``show servers state engines`` rows, by server name.
        lanes: replica name -> ``show servers state lane_<replica>`` rows, by server name.

    Returns:
        For lane ``rX``, over the servers ``rX`` and ``rX-*`` (its detours) of ``engines``:
        ``add server`` for one the lane lacks, ``set server ... addr A port P`` for a moved
        one, ``set server ... state ready|drain|maint`` for a changed admin state; a lane
        server no longer in ``engines`` is put in maintenance and deleted (``del server``).
        Empty when every lane already mirrors ``engines``.
    """
    cmds: list[str] = []
    for rep, rows in sorted(lanes.items()):
        lane = f"lane_{rep}"
        family = {n: r for n, r in engines.items() if n == rep or n.startswith(rep + "-")}
        for name, row in sorted(family.items()):
            addr, port, want = row.get("srv_addr", ""), row.get("srv_port", ""), _state(row)
            have = rows.get(name)
            if have is None:
                cmds.append(f"add server {lane}/{name} {addr}:{port}")
                cmds.append(f"set server {lane}/{name} state {want}")
                continue
            if (have.get("srv_addr"), have.get("srv_port")) != (addr, port):
                cmds.append(f"set server {lane}/{name} addr {addr} port {port}")
            if _state(have) != want:
                cmds.append(f"set server {lane}/{name} state {want}")
        for name in sorted(set(rows) - set(family)):
            if _state(rows[name]) != "maint":
                cmds.append(f"set server {lane}/{name} state maint")
            cmds.append(f"del server {lane}/{name}")
    return cmds


def program_command(binary: str, state_dir: Path, port: int) -> list[str]:
    """argv of the supervised proxy: ``litellm --config STATE/litellm.yaml --host 127.0.0.1
    --port PORT --num_workers 1``."""
    return [
        binary,
        "--config",
        str(Path(state_dir) / CONFIG_FILE),
        "--host",
        "127.0.0.1",
        "--port",
        str(int(port)),
        "--num_workers",
        "1",
    ]


def program_environment() -> dict[str, str]:
    """Environment the lab adds for the proxy: offline model-cost map, no master key (loopback),
    no telemetry."""
    return {
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true",
        "LITELLM_TELEMETRY": "False",
        "LITELLM_LOG": "ERROR",
    }


def version(binary: str) -> str | None:
    """``litellm X.Y.Z`` from the package metadata of ``binary``'s Python (None when unknown)."""
    python = Path(binary).with_name("python")
    if not python.is_file():
        return None
    try:
        proc = subprocess.run(
            [str(python), "-c", "import importlib.metadata as m; print(m.version('litellm'))"],
            capture_output=True,
            text=True,
            timeout=15,
            env=child_env(),
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    v = proc.stdout.strip()
    return f"litellm {v}" if proc.returncode == 0 and v else None
