"""The lab's gateway choice (``haproxy`` | ``nginx`` | ``litellm``, see :mod:`chaoslib_infer.lab.gateways`):
the check of a choice, the config each gateway is written, the supervisord programs it runs, what
is recorded in ``gateway.json``. Dispatches to :mod:`~chaoslib_infer.lab.gateways.nginx` and
:mod:`~chaoslib_infer.lab.gateways.litellm`, which never import it (nor the package): the logic is
here, not in the package's ``__init__`` (issue 22: no module cycle).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

from chaoslib_infer.errors import InferChaosError
from chaoslib_infer.safety.redact import child_env

__all__ = [
    "GATEWAYS",
    "GATEWAY_FILE",
    "GatewayError",
    "check_choice",
    "describe",
    "figured",
    "gateway_of",
    "precheck",
    "record",
    "redact_config",
    "start_programs",
    "write_litellm_config",
    "write_nginx_config",
]

GATEWAYS = ("haproxy", "nginx", "litellm")
GATEWAY_FILE = "gateway.json"
#: config text kept in the evidence is cut here (characters)
_KEEP_CHARS = 20000
_SECRET_LINE = re.compile(
    r"(?im)^(?P<head>[^\n#]*?(?:api[_-]?key|authorization|password|passwd|secret|token|"
    r"master[_-]?key|bearer)[^\n]*?[\s:=\"'])(?P<value>[^\s\"';]{6,})"
)


class GatewayError(InferChaosError):
    """A gateway choice or config the lab refuses (one line)."""


def check_choice(gateway: str, gateway_config: str | Path | None) -> str | None:
    """Validate ``gateway`` / ``gateway_config`` before anything starts.

    Returns:
        The config text (None: the gateway's default).

    Raises:
        GatewayError: an unknown gateway, a config file that cannot be read, or a missing
            haproxy / nginx / litellm binary.
    """
    if gateway not in GATEWAYS:
        raise GatewayError(f"gateway must be one of {', '.join(GATEWAYS)}, got {gateway!r}")
    if gateway == "haproxy":
        if gateway_config is None:
            return None
        from chaoslib_infer.lab.haproxy import find_haproxy

        if find_haproxy() is None:
            raise GatewayError("haproxy not found: apt-get install haproxy")
    elif gateway == "litellm":
        import chaoslib_infer.lab.gateways.litellm as litellm

        if litellm.find_litellm() is None:
            raise GatewayError(
                f"litellm not found: scripts/quickstart litellm installs it into "
                f"{litellm.VENV_BINARY.parent.parent} (or set ${litellm.ENV_BINARY})"
            )
    else:
        import chaoslib_infer.lab.gateways.nginx as nginx

        if nginx.find_nginx() is None:
            raise GatewayError("nginx not found: apt-get install nginx-light")
    if gateway_config is None:
        return None
    path = Path(gateway_config)
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise GatewayError(f"gateway_config {path}: cannot read it: {exc}") from None


def gateway_of(meta: dict[str, Any]) -> str:
    """The gateway of a lab's ``lab.json`` mapping (``haproxy`` for older labs)."""
    return str(meta.get("gateway") or "haproxy")


def figured(meta: dict[str, Any]) -> bool:
    """Whether a lab (its ``lab.json`` mapping) gets the gateway figures
    (:mod:`chaoslib_infer.lab.gateways.figures`): nginx, LiteLLM, and HAProxy with the user's
    config; HAProxy with the lab's own settings keeps its rows as before."""
    return gateway_of(meta) != "haproxy" or bool(
        (meta.get("gateway_info") or {}).get("config_path")
    )


def redact_config(text: str) -> str:
    """``text`` with the secrets this process knows scrubbed
    (:func:`chaoslib_infer.safety.redact.scrub`) and the value of every line that names a key,
    token, password or Authorization header replaced by ``[REDACTED]``; cut to 20,000 chars."""
    from chaoslib_infer.safety.redact import scrub

    out = _SECRET_LINE.sub(lambda m: m["head"] + "[REDACTED]", scrub(text))
    return out[:_KEEP_CHARS]


def _lab_meta(state_dir: Path) -> dict[str, Any]:
    from chaoslib_infer.lab.statedir import LAB_FILE

    meta: dict[str, Any] = json.loads((Path(state_dir) / LAB_FILE).read_text())
    return meta


def _user_config(meta: dict[str, Any], default_name: str) -> tuple[str | None, str]:
    """The user's gateway config of a lab (``lab.json``'s ``gateway_info.config_path``): its
    text (None: the gateway's default) and what to call it in an error."""
    path = (meta.get("gateway_info") or {}).get("config_path")
    text = Path(path).read_text(encoding="utf-8") if path else None
    return text, str(path or default_name)


def write_nginx_config(state_dir: Path, servers: list[dict[str, str]]) -> Path:
    """Render the lab's nginx.conf for ``servers`` (via a ``.new`` file checked with
    ``nginx -t``, then renamed) and remember each address in ``gateway-servers.json``.

    Raises:
        NginxError: the config does not render or nginx rejects it (nginx.conf is unchanged).
        GatewayError: nginx not found.
    """
    import chaoslib_infer.lab.gateways.nginx as nginx

    sd = Path(state_dir)
    meta = _lab_meta(sd)
    binary = nginx.find_nginx()
    if binary is None:
        raise GatewayError("nginx not found: apt-get install nginx-light")
    user_text, source = _user_config(meta, "the default nginx config")
    text = nginx.render_config(
        sd, str(meta["lab_id"]), int(meta["port"]), servers, user_text, source
    )
    new = sd / (nginx.CONFIG_FILE + ".new")
    new.write_text(text)
    nginx.check_config(binary, sd, new, source)
    names = nginx.read_servers(sd)
    names.update({s["addr"]: s["name"] for s in servers})
    (sd / nginx.SERVERS_FILE).write_text(json.dumps(names, indent=1, sort_keys=True))
    new.replace(sd / nginx.CONFIG_FILE)
    return sd / nginx.CONFIG_FILE


def _version(binary: str) -> str | None:
    try:
        proc = subprocess.run(
            [binary, "-v"], capture_output=True, text=True, timeout=5, env=child_env()
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = (proc.stderr or proc.stdout).strip().splitlines()
    return lines[0] if lines else None


def record(
    state_dir: Path, gateway: str, config_path: str | None, text: str | None
) -> dict[str, Any]:
    """Write ``gateway.json`` (the evidence's gateway block) and return it: ``{"gateway",
    "config_path", "config" (scrubbed text, None for the default), "version"}``."""
    info: dict[str, Any] = {"gateway": gateway, "config_path": config_path, "config": None}
    if gateway == "haproxy":
        from chaoslib_infer.lab.haproxy import find_haproxy

        binary = find_haproxy()
        info["version"] = _version(binary) if binary else None
        info["config"] = redact_config(text) if text is not None else "(the lab's default)"
    elif gateway == "nginx":
        import chaoslib_infer.lab.gateways.nginx as nginx

        binary = nginx.find_nginx()
        info["version"] = _version(binary) if binary else None
        info["config"] = redact_config(text) if text is not None else "(the lab's default)"
    elif gateway == "litellm":
        import chaoslib_infer.lab.gateways.litellm as litellm

        binary = litellm.find_litellm()
        info["version"] = litellm.version(binary) if binary else None
        info["config"] = redact_config(text) if text is not None else "(the lab's default)"
        lanes = _lab_meta(Path(state_dir)).get("lanes") or {}
        info["lanes"] = lanes
        routed = litellm.routed_replicas(Path(state_dir) / litellm.CONFIG_FILE, lanes)
        info["replicas_in_model_list"] = routed
        # a replica whose lane no deployment names never gets LiteLLM's traffic (a standby one
        # the autoscaler adds later, unless the config lists all_replicas or the service)
        info["replicas_not_in_model_list"] = sorted(set(lanes) - set(routed))
    (Path(state_dir) / GATEWAY_FILE).write_text(json.dumps(info, indent=1))
    return info


def describe(state_dir: Path | str | None) -> dict[str, Any]:
    """The gateway block of a lab (``gateway.json``), ``{"gateway": "haproxy"}`` without one."""
    if state_dir is None:
        return {}
    try:
        data = json.loads((Path(state_dir) / GATEWAY_FILE).read_text())
    except (OSError, ValueError):
        return {"gateway": "haproxy", "config": "(the lab's HAProxy settings)"}
    return data if isinstance(data, dict) else {}


_PROGRAMS = """
[program:gateway]
command={command}
priority=6
autorestart=true
startsecs=0
startretries=3
stopsignal=TERM
stopwaitsecs=3
{environment}stopasgroup=true
killasgroup=true
redirect_stderr=true
stdout_logfile={logs}/gateway.log
stdout_logfile_maxbytes=0

[program:gateway-sync]
command={sync}
priority=7
autorestart=true
startsecs=0
stopwaitsecs=2
redirect_stderr=true
stdout_logfile={logs}/gateway-sync.log
stdout_logfile_maxbytes=0
"""


def write_litellm_config(state_dir: Path, in_service: list[str]) -> Path:
    """Render the lab's ``litellm.yaml`` (the user's config or the default; the lanes of
    ``lab.json``; ``in_service``: the replicas the default ``model_list`` lists).

    Raises:
        LiteLLMError: the config does not render or is refused (see ``litellm.render_config``).
    """
    import chaoslib_infer.lab.gateways.litellm as litellm

    sd = Path(state_dir)
    meta = _lab_meta(sd)
    user_text, source = _user_config(meta, "the default LiteLLM config")
    text = litellm.render_config(
        user_text,
        {k: int(v) for k, v in (meta.get("lanes") or {}).items()},
        in_service,
        int(meta["haproxy_port"]),
        str(meta["lab_id"]),
        source,
    )
    path = sd / litellm.CONFIG_FILE
    path.write_text(text)
    return path


def start_programs(state_dir: Path, servers: list[dict[str, str]], python: str) -> str:
    """Render and check the gateway's first config (``servers``: the replicas in service), and
    return the supervisord blocks ``[program:gateway]`` (nginx or LiteLLM's proxy) and
    ``[program:gateway-sync]``.

    Raises:
        NginxError, LiteLLMError: the config does not render or the gateway rejects it.
        GatewayError: the gateway's binary not found.
    """
    import shlex

    sd = Path(state_dir)
    meta = _lab_meta(sd)

    def conf(argv: list[str]) -> str:
        return shlex.join(argv).replace("%", "%%")

    if gateway_of(meta) == "litellm":
        import chaoslib_infer.lab.gateways.litellm as litellm

        write_litellm_config(sd, [s["name"] for s in servers])
        binary = litellm.find_litellm()
        if binary is None:
            raise GatewayError("litellm not found: scripts/quickstart litellm")
        command = litellm.program_command(binary, sd, int(meta["port"]))
        env = ",".join(f'{k}="{v}"' for k, v in litellm.program_environment().items())
        environment = f"environment={env}\n"
    else:
        import chaoslib_infer.lab.gateways.nginx as nginx

        write_nginx_config(sd, servers)
        command = nginx.program_command(nginx.find_nginx() or "nginx", sd)
        environment = ""
    return _PROGRAMS.format(
        command=conf(command),
        environment=environment,
        sync=conf([python, "-m", "chaoslib_infer.lab.gateways.sync", "--state-dir", str(sd)]),
        logs=sd / "logs",
    )


def precheck(gateway: str, gateway_config: str | Path | None, servers: list[str]) -> None:
    """Render the gateway's config for placeholder replicas ``servers`` and run its own check
    (``nginx -t``; for LiteLLM the lab's reading of its proxy config: YAML, ``model_list``,
    refused settings) in a scratch directory, before the lab starts anything.

    Raises:
        GatewayError: the config does not render or the gateway rejects it (one line).
    """
    text = check_choice(gateway, gateway_config)
    if gateway == "haproxy":
        if text is not None:
            _precheck_haproxy(text, str(gateway_config), servers)
        return
    if gateway == "litellm":
        import chaoslib_infer.lab.gateways.litellm as litellm

        lanes = {n: 41000 + i for i, n in enumerate(servers)}
        source = str(gateway_config or "the default LiteLLM config")
        try:
            litellm.render_config(text, lanes, list(servers), 8800, "check", source)
        except litellm.LiteLLMError as exc:
            raise GatewayError(str(exc)) from None
        return
    if gateway != "nginx":
        return
    import tempfile

    import chaoslib_infer.lab.gateways.nginx as nginx

    binary = nginx.find_nginx() or "nginx"
    source = str(gateway_config or "the default nginx config")
    placeholder = [{"name": n, "addr": f"127.0.0.1:{40000 + i}"} for i, n in enumerate(servers)]
    with tempfile.TemporaryDirectory(prefix="chaos-infer-nginx-") as tmp:
        sd = Path(tmp)
        (sd / "logs").mkdir()
        conf = sd / nginx.CONFIG_FILE
        try:
            conf.write_text(nginx.render_config(sd, "check", 8800, placeholder, text, source))
            nginx.check_config(binary, sd, conf, source)
        except nginx.NginxError as exc:
            raise GatewayError(str(exc)) from None


def _precheck_haproxy(text: str, source: str, servers: list[str]) -> None:
    """The user's haproxy.cfg rendered for placeholder ``servers`` and checked by ``haproxy -c``
    in a scratch directory.

    Raises:
        GatewayError: it does not render, the lab refuses it or HAProxy does (one line).
    """
    import tempfile

    import chaoslib_infer.lab.gateways.haproxy_user as hap_user
    from chaoslib_infer.lab.haproxy import find_haproxy

    rows = [{"name": n, "host": "127.0.0.1", "port": 40000 + i} for i, n in enumerate(servers)]
    with tempfile.TemporaryDirectory(prefix="chaos-infer-haproxy-") as tmp:
        sd = Path(tmp)
        variables = hap_user.template_variables("check", 8800, rows, "/health", sd)
        try:
            rendered = hap_user.render_config(text, variables, sd / "haproxy.sock", servers, source)
            (sd / "haproxy.cfg").write_text(rendered)
            hap_user.check_config(find_haproxy() or "haproxy", sd / "haproxy.cfg", source)
        except hap_user.HAProxyConfigError as exc:
            raise GatewayError(str(exc)) from None
