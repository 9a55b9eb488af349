"""HAProxy with the user's config (``gateway: haproxy`` + ``gateway_config``): the user's
haproxy.cfg as a Jinja2 template over the lab's replicas, with what the lab needs put back in.

**Template variables** (``StrictUndefined``: an unknown one is one clear error): ``listen``
(``127.0.0.1:PORT``, the lab's URL), ``backend`` (``engines``), ``servers`` (every replica,
standby ones too: ``[{"name", "addr", "host", "port", "standby"}]``), ``server_lines`` (the
lab's ``server rN ADDR check`` lines), ``health_path`` (the engines' health path), ``log_format``
(the lab's, for reading), ``lab_id``, ``state_dir``.

**Injected** by the lab (the user cannot remove them): in ``global``, the runtime socket
(``stats socket STATE/haproxy.sock mode 600 level admin``: the drills' maintenance, detour and
node-move steps, the recorder's ``show stat`` samples) and ``log stdout format raw local0``; in
the frontend that binds ``listen``, ``mode http``, ``log global``, the lab's ``log-format``
(:data:`chaoslib_infer.lab.haproxy.LOG_FORMAT`: the request log every figure reads) and
``capture request header X-Request-Id len 64``; in backend ``engines``, ``http-response
set-header X-Lab-Server %s``. Standby replicas' server lines get ``disabled`` (MAINT).

**Required** of the config (refused with one line otherwise): one ``frontend``/``listen`` section
that binds ``listen``; a ``backend engines`` with exactly one ``server <replica>`` line per replica
(the runtime steps act on ``engines/<replica>``). **Refused** because they would take the runtime
socket or the request log away: ``stats socket``, ``daemon``, ``master-worker``,
``user``/``group``/``uid``/``gid``/``chroot`` (the lab runs HAProxy unprivileged, in the
foreground), a global ``log stdout``/``log stderr`` (it would double the request log; in
``defaults`` too); in the lab's frontend its own ``log-format``, ``option httplog``/``tcplog``/
``httpslog``, ``option logasap``, ``option dontlog-normal``, ``no log``, a ``log`` target other than
``log global``, ``capture request header``, ``mode tcp``; ``option logasap`` or ``option
dontlog-normal`` in a ``defaults`` section. Then ``haproxy -c`` checks the rendered file
(:func:`check_config`). Sections and keywords: HAProxy 2.6 configuration manual, sections 2-4.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

from chaoslib_infer.errors import InferChaosError
from chaoslib_infer.lab.gateways.templating import render
from chaoslib_infer.lab.haproxy import LOG_FORMAT
from chaoslib_infer.safety.redact import child_env

__all__ = [
    "BACKEND",
    "HAProxyConfigError",
    "check_config",
    "render_config",
    "template_variables",
]

BACKEND = "engines"
#: the keywords that open a section (HAProxy configuration manual, section 2.1 and 3-4)
_SECTIONS = frozenset(
    {
        "global",
        "defaults",
        "frontend",
        "backend",
        "listen",
        "peers",
        "resolvers",
        "userlist",
        "mailers",
        "program",
        "http-errors",
        "ring",
        "cache",
    }
)
#: global keywords the lab owns (runtime socket) or cannot honour (unprivileged, foreground)
_GLOBAL_REFUSED = {
    "stats socket": "the lab injects its own runtime socket",
    "daemon": "the lab runs HAProxy in the foreground under supervisord",
    "master-worker": "the lab runs HAProxy in the foreground under supervisord",
    "user": "the lab runs HAProxy unprivileged",
    "group": "the lab runs HAProxy unprivileged",
    "uid": "the lab runs HAProxy unprivileged",
    "gid": "the lab runs HAProxy unprivileged",
    "chroot": "the lab runs HAProxy unprivileged",
}
#: keywords of the lab's frontend that would change or drop the request log
_FRONTEND_REFUSED = (
    "log-format",
    "option httplog",
    "option tcplog",
    "option httpslog",
    "option logasap",
    "option dontlog-normal",
    "no log",
    "capture request header",
    "mode tcp",
)
_DEFAULTS_REFUSED = ("option logasap", "option dontlog-normal")


class HAProxyConfigError(InferChaosError):
    """A user's haproxy.cfg the lab refuses; the message is one line."""


def template_variables(
    lab_id: str,
    port: int,
    servers: list[dict[str, Any]],
    health_path: str,
    state_dir: Path,
) -> dict[str, Any]:
    """The template's variables (module docstring).

    Args:
        lab_id: the lab's id.
        port: the lab's port on 127.0.0.1.
        servers: every replica, ``[{"name", "host", "port", "standby"}]`` (``standby`` bool).
        health_path: the engines' health path (``/health`` for the sim engine).
        state_dir: the lab's state directory.
    """
    rows = [
        {
            "name": str(s["name"]),
            "host": str(s["host"]),
            "port": int(s["port"]),
            "addr": f"{s['host']}:{int(s['port'])}",
            "standby": bool(s.get("standby")),
        }
        for s in servers
    ]
    return {
        "listen": f"127.0.0.1:{int(port)}",
        "backend": BACKEND,
        "servers": rows,
        "server_lines": "\n    ".join(f"server {s['name']} {s['addr']} check" for s in rows),
        "health_path": health_path,
        "log_format": LOG_FORMAT,
        "lab_id": lab_id,
        "state_dir": str(state_dir),
    }


def _words(line: str) -> list[str]:
    return line.split("#", 1)[0].split()


def _starts(words: list[str], keyword: str) -> bool:
    return [w.lower() for w in words[: len(keyword.split())]] == keyword.split()


def _sections(lines: list[str]) -> list[tuple[int, str, str]]:
    """``(line index, section keyword, name)`` of every section header."""
    out = []
    for i, ln in enumerate(lines):
        w = _words(ln)
        if w and w[0].lower() in _SECTIONS:
            out.append((i, w[0].lower(), w[1] if len(w) > 1 else ""))
    return out


def _body(lines: list[str], sections: list[tuple[int, str, str]], k: int) -> range:
    end = sections[k + 1][0] if k + 1 < len(sections) else len(lines)
    return range(sections[k][0] + 1, end)


def render_config(
    user_config: str,
    variables: dict[str, Any],
    stats_socket: Path,
    replicas: list[str],
    source: str,
) -> str:
    """Render the user's template and put the lab's lines in (module docstring).

    Args:
        user_config: the template's text.
        variables: :func:`template_variables`.
        stats_socket: the lab's runtime socket path.
        replicas: every replica's name (each needs one ``server`` line in backend ``engines``).
        source: what to call the config in an error (its path).

    Returns:
        The haproxy.cfg text (standby replicas not yet ``disabled``: the caller marks them).

    Raises:
        HAProxyConfigError: a template error, a refused keyword, a missing frontend or server
            line; one line naming the rendered line where there is one.
    """
    text = render(user_config, "", variables, source, HAProxyConfigError)
    lines = text.splitlines()
    secs = _sections(lines)

    def refuse(i: int, what: str, why: str) -> HAProxyConfigError:
        return HAProxyConfigError(
            f"{source}: {what}: {why} (rendered haproxy.cfg line {i + 1}: {lines[i].strip()!r})"
        )

    listen = str(variables["listen"])
    fronts = []
    for k, (_, kind, _name) in enumerate(secs):
        body = _body(lines, secs, k)
        if kind == "global":
            for j in body:
                w = _words(lines[j])
                for kw, why in _GLOBAL_REFUSED.items():
                    if _starts(w, kw):
                        raise refuse(j, f"'{kw}' in global", why)
                if _starts(w, "log") and len(w) > 1 and w[1] in ("stdout", "stderr"):
                    raise refuse(j, f"'log {w[1]}' in global", "the lab's request log is stdout")
        elif kind == "defaults":
            for j in body:
                w = _words(lines[j])
                for kw in _DEFAULTS_REFUSED:
                    if _starts(w, kw):
                        raise refuse(j, f"'{kw}' in defaults", "it drops the lab's request log")
                if _starts(w, "log") and len(w) > 1 and w[1] in ("stdout", "stderr"):
                    raise refuse(j, f"'log {w[1]}' in defaults", "the lab's request log is stdout")
        elif kind in ("frontend", "listen"):
            binds = [_words(lines[j]) for j in body if _starts(_words(lines[j]), "bind")]
            if any(len(b) > 1 and b[1] == listen for b in binds):
                fronts.append(k)
    if len(fronts) != 1:
        raise HAProxyConfigError(
            f"{source}: {len(fronts)} frontend sections bind {listen} ({{{{ listen }}}}), "
            "expected 1: the lab's clients reach HAProxy there"
        )
    front = fronts[0]
    for j in _body(lines, secs, front):
        w = _words(lines[j])
        for kw in _FRONTEND_REFUSED:
            if _starts(w, kw):
                raise refuse(j, f"'{kw}' in the lab's frontend", "the lab owns its request log")
        if _starts(w, "log") and w[1:2] != ["global"]:
            raise refuse(j, "a 'log' target in the lab's frontend", "the lab owns its request log")
    backs = [k for k, (_, kind, name) in enumerate(secs) if kind == "backend" and name == BACKEND]
    if len(backs) != 1:
        raise HAProxyConfigError(
            f"{source}: {len(backs)} 'backend {BACKEND}' sections, expected 1: the drills' "
            f"runtime steps act on {BACKEND}/<replica> ({{{{ server_lines }}}} writes its servers)"
        )
    for rep in replicas:
        n = sum(1 for j in _body(lines, secs, backs[0]) if _words(lines[j])[:2] == ["server", rep])
        if n != 1:
            raise HAProxyConfigError(
                f"{source}: backend {BACKEND} has {n} 'server {rep}' lines, expected 1 per "
                "replica ({{ server_lines }}, or {% for s in servers %}server {{ s.name }} "
                "{{ s.addr }} check ...{% endfor %})"
            )
    fmt = LOG_FORMAT.replace('"', '\\"')
    inject = {
        backs[0]: ["    http-response set-header X-Lab-Server %s  # injected by the lab"],
        front: [
            "    # injected by the lab: its request log (the drills' figures read it)",
            "    mode http",
            "    log global",
            f'    log-format "{fmt}"',
            "    capture request header X-Request-Id len 64",
        ],
    }
    glob = [k for k, (_, kind, _) in enumerate(secs) if kind == "global"]
    lab_global = [
        "    # injected by the lab: its request log (stdout) and runtime socket",
        "    log stdout format raw local0",
        f"    stats socket {stats_socket} mode 600 level admin",
    ]
    out = list(lines)
    for k in sorted(inject, key=lambda k: -secs[k][0]):
        at = secs[k][0] + 1
        out[at:at] = inject[k]
    if glob:
        at = secs[glob[0]][0] + 1
        out[at:at] = lab_global
    else:
        out[0:0] = ["global", *lab_global, ""]
    return "\n".join(out) + "\n"


_ALERT = re.compile(r"\[(?:ALERT|FATAL)\][^:]*:\s*(?:config\s*:\s*)?(?P<msg>.*)")
_WHERE = re.compile(r"parsing \[[^\]]*:(?P<line>\d+)\]\s*:\s*")


def check_config(binary: str, path: Path, source: str) -> None:
    """``haproxy -c -f path`` (``-q`` would hide its alerts).

    Raises:
        HAProxyConfigError: HAProxy rejected it: ``"<source>: haproxy rejected it: <its first
            alert> (rendered haproxy.cfg line N)"``, one line.
    """
    try:
        proc = subprocess.run(
            [binary, "-c", "-f", str(path)],
            capture_output=True,
            text=True,
            timeout=10,
            env=child_env(),
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise HAProxyConfigError(f"{source}: haproxy -c did not run: {exc}") from None
    if proc.returncode == 0:
        return
    text = (proc.stderr or "") + (proc.stdout or "")
    msg = next(
        (m["msg"].strip() for ln in text.splitlines() if (m := _ALERT.search(ln))),
        text.strip().splitlines()[0] if text.strip() else f"exit {proc.returncode}",
    )
    where = _WHERE.search(msg)
    if where:
        msg = (
            msg[: where.start()]
            + msg[where.end() :]
            + f" (rendered haproxy.cfg line {where['line']})"
        )
    raise HAProxyConfigError(f"{source}: haproxy rejected it: {msg}")


def lab_config(
    meta: dict[str, Any], state_dir: Path, health_path: str, user_config: str, source: str
) -> str:
    """The lab's haproxy.cfg from the user's template: every replica of ``meta`` (``lab.json``)
    a server on loopback (nodes rewrite the addresses later), standby ones ``disabled``.

    Raises:
        HAProxyConfigError: see :func:`render_config`; a standby replica without its line.
    """
    from chaoslib_infer.lab.standby import mark_standby_servers
    from chaoslib_infer.lab.statedir import HAPROXY_SOCK, LabError

    sd = Path(state_dir)
    reps = meta["replicas"]
    servers = [
        {"name": r["name"], "host": "127.0.0.1", "port": r["port"], "standby": r.get("standby")}
        for r in reps
    ]
    port = int(meta.get("haproxy_port") or meta["port"])
    variables = template_variables(str(meta["lab_id"]), port, servers, health_path, sd)
    text = render_config(
        user_config, variables, sd / HAPROXY_SOCK, [r["name"] for r in reps], source
    )
    try:
        return mark_standby_servers(text, [r["name"] for r in reps if r.get("standby")])
    except LabError as exc:
        raise HAProxyConfigError(f"{source}: {exc}") from None
