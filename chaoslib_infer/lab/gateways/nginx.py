"""nginx as the lab's gateway (``Lab.up(gateway="nginx")``): configuration, check, reload, log.

What the lab starts: ``nginx -p STATE_DIR -c nginx.conf -e logs/nginx.err -g "daemon off; pid
nginx.pid;"`` under supervisord (program ``gateway``), listening on the lab's URL. HAProxy keeps
running beside it, off the client path, as the lab's intent plane (the drills' maintenance,
detour and node-move steps act on its runtime socket; :mod:`chaoslib_infer.lab.gateways.sync`
mirrors them into nginx's upstream and reloads nginx) and as the health checker whose view the
recorder samples.

The configuration is a Jinja2 template (``StrictUndefined``: an unknown variable is one clear
error), rendered again each time the upstream changes. Three forms, told apart by their text:

- **a full nginx.conf** (it has an ``http {`` block): the user's file as is, which must place
  ``{{ lab_http }}`` inside ``http {}`` (the lab's ``log_format`` and ``access_log``: the request
  log the drills read) and listen on ``{{ listen }}``; the upstream is ``{{ upstream_block }}``
  (or the user's own ``upstream`` over ``{% for s in servers %}``);
- **server blocks** (a ``server {`` at top level): put inside the lab's ``http {}``;
- **a location snippet** (anything else, e.g. ``location / { proxy_pass http://{{ upstream }};
  ... }``): put inside the lab's ``server { listen {{ listen }}; }``.

Template variables: ``listen`` (``127.0.0.1:PORT``), ``upstream`` (``lab_engines``), ``servers``
(``[{"name": "r0", "addr": "127.0.0.1:PORT"}, ...]``: the replicas in service now),
``upstream_block`` (the default ``upstream lab_engines { least_conn; server ...; }``),
``lab_http``, ``state_dir``, ``lab_id``. Without a config the lab uses its default location
(``templates/nginx-default.conf.j2``: ``proxy_buffering off``, ``proxy_read_timeout 60s``,
``proxy_next_upstream error``).

Request log (``gateway-requests.log``, one line per request, see :data:`LOG_FORMAT`)::

    G1 <end unix s.ms> <request_time s> <status> "<upstream_addr>" "<upstream_status>"
       "<upstream_connect_time>" "<upstream_header_time>" "<upstream_response_time>"
       <bytes_sent> {<X-Request-Id>} "<request line>"

:func:`parse_line` turns one into a :class:`chaoslib_infer.lab.requestlog.RequestLogEntry` (the
server named from ``gateway-servers.json``: address -> replica), so every reader of the lab's
request log reads nginx's too.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from chaoslib_infer.errors import InferChaosError
from chaoslib_infer.lab.gateways.templating import environment, render
from chaoslib_infer.lab.requestlog import SERVERS_FILE, parse_line, read_servers, upstream_tries
from chaoslib_infer.safety.redact import child_env

__all__ = [
    "ACCESS_LOG",
    "CONFIG_FILE",
    "LOG_FORMAT",
    "SERVERS_FILE",
    "UPSTREAM",
    "NginxError",
    "check_config",
    "find_nginx",
    "parse_line",
    "program_command",
    "read_servers",
    "render_config",
    "upstream_tries",
]

CONFIG_FILE = "nginx.conf"
ACCESS_LOG = "gateway-requests.log"
UPSTREAM = "lab_engines"
NGINX_CANDIDATES = ("/usr/sbin/nginx", "/usr/local/sbin/nginx")
LOG_FORMAT = (
    'G1 $msec $request_time $status "$upstream_addr" "$upstream_status" '
    '"$upstream_connect_time" "$upstream_header_time" "$upstream_response_time" '
    '$bytes_sent {$http_x_request_id} "$request"'
)
_DIRECTIVE = re.compile(r"^\s*(daemon|pid|master_process)\s", re.MULTILINE)


class NginxError(InferChaosError):
    """A gateway config nginx (or the lab's template) refuses; the message is one line."""


def find_nginx() -> str | None:
    """Path of the nginx binary, or None (``apt-get install nginx-light`` provides it)."""
    for cand in NGINX_CANDIDATES:
        if Path(cand).is_file():
            return cand
    return shutil.which("nginx")


def upstream_block(servers: list[dict[str, str]]) -> str:
    """The default upstream: ``least_conn`` over ``servers`` (nginx's defaults otherwise:
    ``max_fails=1 fail_timeout=10s``), every server ``down`` when none is in service."""
    lines = [f"upstream {UPSTREAM} {{", "    least_conn;"]
    lines += [f"    server {s['addr']};  # {s['name']}" for s in servers]
    if not servers:
        lines.append("    server 127.0.0.1:9 down;  # no replica in service")
    lines += ["    keepalive 32;", "}"]
    return "\n".join(lines)


def render_config(
    state_dir: Path,
    lab_id: str,
    port: int,
    servers: list[dict[str, str]],
    user_config: str | None,
    source: str = "gateway_config",
) -> str:
    """Render the lab's nginx.conf.

    Args:
        state_dir: the lab's state directory (the access log goes there).
        lab_id: the lab's id (a comment in the file).
        port: the lab's port on 127.0.0.1.
        servers: the replicas in service, ``[{"name", "addr": "host:port"}]``.
        user_config: the text of the user's config (a template, see the module docstring), or
            None for the project's default location.
        source: what to call the config in an error (its path).

    Returns:
        The configuration text.

    Raises:
        NginxError: a template error (syntax, unknown variable), a full config without
            ``{{ lab_http }}``, or one that sets ``daemon``/``pid``/``master_process`` (the lab
            sets them on the command line).
    """
    access_log = Path(state_dir) / ACCESS_LOG
    lab_http = f"log_format chaos_infer '{LOG_FORMAT}';\n    access_log {access_log} chaos_infer;"
    variables: dict[str, Any] = {
        "listen": f"127.0.0.1:{int(port)}",
        "upstream": UPSTREAM,
        "servers": servers,
        "upstream_block": upstream_block(servers),
        "lab_http": lab_http,
        "state_dir": str(state_dir),
        "lab_id": lab_id,
    }
    snippet = render(user_config, "nginx-default.conf.j2", variables, source, NginxError)
    if _DIRECTIVE.search(snippet):
        name = _DIRECTIVE.search(snippet).group(1)  # type: ignore[union-attr]
        raise NginxError(f"{source}: sets '{name}': the lab sets daemon/pid itself; remove it")
    if re.search(r"^\s*http\s*\{", snippet, re.MULTILINE):
        if "log_format chaos_infer" not in snippet:
            raise NginxError(
                f"{source}: a full nginx.conf must place {{{{ lab_http }}}} inside http {{}} "
                "(the lab's request log)"
            )
        return snippet
    is_server = bool(re.search(r"^\s*server\s*\{", snippet, re.MULTILINE))
    return (
        environment()
        .get_template("nginx-main.conf.j2")
        .render(
            **variables,
            server_snippet=snippet.strip() if is_server else "",
            location_snippet="" if is_server else snippet.strip(),
        )
    )


def program_command(nginx_bin: str, state_dir: Path) -> list[str]:
    """argv of the supervised nginx (foreground, pid and error log in ``state_dir``)."""
    sd = Path(state_dir)
    return [
        nginx_bin,
        "-p",
        f"{sd}/",
        "-c",
        str(sd / CONFIG_FILE),
        "-e",
        str(sd / "logs" / "nginx.err"),
        "-g",
        f"daemon off; pid {sd / 'nginx.pid'};",
    ]


def check_config(nginx_bin: str, state_dir: Path, config: Path, source: str) -> None:
    """``nginx -t`` on ``config``; raises NginxError with nginx's first complaint.

    Raises:
        NginxError: nginx rejects the file (its ``[emerg]`` line, paths shortened), or nginx
            does not answer within 10 s.
    """
    sd = Path(state_dir)
    argv = [
        nginx_bin,
        "-t",
        "-q",
        "-p",
        f"{sd}/",
        "-c",
        str(config),
        "-e",
        str(sd / "logs" / "nginx-check.err"),
        "-g",
        f"daemon off; pid {sd / 'nginx-check.pid'};",
    ]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=10, env=child_env())
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NginxError(f"{source}: nginx -t could not run: {exc}") from None
    if proc.returncode != 0:
        text = (proc.stderr or proc.stdout).strip().splitlines()
        emerg = [ln for ln in text if "[emerg]" in ln] or text or [f"exit {proc.returncode}"]
        msg = re.sub(r"^nginx: \[emerg\] ", "", emerg[0])
        msg = re.sub(r" in /\S*?([^/\s]+\.conf(?:\.new)?):(\d+)$", r" (rendered \1 line \2)", msg)
        raise NginxError(f"{source}: nginx rejected it: {msg}")
