"""Mirror the lab's intent (HAProxy's server states) into a gateway's upstream (nginx, LiteLLM).

The drills change which replicas are in service through HAProxy's runtime socket: a standby
replica set ready by the autoscaler, a replica in maintenance behind a jitter detour, a replica
moved to the spare node (``set server addr``). With ``gateway: nginx`` HAProxy is off the client
path, so this process (supervised as ``gateway-sync``) polls ``show servers state engines`` every
``--interval-s`` (0.1 s) and, when the set of servers in service (admin state ready: not in
maintenance, not draining) or their addresses change, renders nginx.conf again, checks it with
``nginx -t`` and reloads nginx (SIGHUP to its master). Health-check states are never mirrored:
nginx OSS has no active health checks, and the lab does not lend it HAProxy's.

With ``gateway: litellm`` the same poll mirrors each replica's servers of ``engines`` into its
lane (:func:`chaoslib_infer.lab.gateways.litellm.lane_commands`, HAProxy runtime commands): the
proxy's config never changes.

Each change is one line of ``gateway-sync.jsonl``: ``{"t" (unix s), "servers": [names],
"reload_s" (render + check + signal, s), "ok", "error"?}`` (LiteLLM: ``"commands"`` sent
instead of a reload); the first line is the start.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["SYNC_LOG", "in_service", "main", "sync_lanes", "sync_once"]

SYNC_LOG = "gateway-sync.jsonl"


def in_service(rows: dict[str, dict[str, str]]) -> list[dict[str, str]]:
    """Servers of ``show servers state`` rows whose admin state is ready (0), by name.

    Returns:
        ``[{"name", "addr": "host:port"}]`` sorted by name.
    """
    out = []
    for name, row in sorted(rows.items()):
        try:
            admin = int(row.get("srv_admin_state", "1"))
        except ValueError:
            continue
        if admin == 0:
            out.append({"name": name, "addr": f"{row.get('srv_addr')}:{row.get('srv_port')}"})
    return out


def _append(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record, separators=(",", ":")) + "\n")


def sync_once(state_dir: Path, servers: list[dict[str, str]], signal_nginx: bool = True) -> None:
    """Render nginx.conf for ``servers``, check it, and (``signal_nginx``) reload nginx.

    Raises:
        NginxError: the rendered config does not parse (the running nginx keeps the old one).
        LabError: no lab in ``state_dir``.
    """
    from chaoslib_infer.lab.gateways import dispatch

    dispatch.write_nginx_config(state_dir, servers)
    if signal_nginx:
        try:
            pid = int((state_dir / "nginx.pid").read_text().split()[0])
            os.kill(pid, signal.SIGHUP)
        except (OSError, ValueError, IndexError):
            pass  # not running (yet): supervisord starts it on the new file


def sync_lanes(sock: Path, lanes: list[str]) -> list[str]:
    """Send the commands that make every lane mirror ``engines`` (LiteLLM labs).

    Returns:
        The commands sent (empty: nothing changed), each with the first line of HAProxy's
        answer when it had one (``"cmd -> answer"``; a command HAProxy refused leaves the lane
        different from ``engines``, so it is sent again at the next poll).

    Raises:
        OSError: the runtime socket does not answer.
    """
    from chaoslib_infer.lab.gateways.litellm import lane_commands
    from chaoslib_infer.lab.haproxy import servers_state, stats_command

    engines = servers_state(sock, "engines")
    rows = {rep: servers_state(sock, f"lane_{rep}") for rep in lanes}
    sent = []
    for cmd in lane_commands(engines, rows):
        answer = stats_command(sock, cmd).strip()
        sent.append(f"{cmd} -> {answer.splitlines()[0]}" if answer else cmd)
    return sent


def _lanes_loop(sd: Path, lanes: list[str], interval_s: float, stop: dict[str, bool]) -> None:
    log = sd / SYNC_LOG
    _append(log, {"t": time.time(), "event": "start", "lanes": lanes})
    while not stop["now"]:
        t0 = time.monotonic()
        try:
            sent = sync_lanes(sd / "haproxy.sock", lanes)
        except OSError:
            sent = []
        if sent:
            _append(
                log,
                {
                    "t": time.time(),
                    "commands": sent,
                    "reload_s": round(time.monotonic() - t0, 4),
                },
            )
        time.sleep(interval_s)


def main(argv: list[str] | None = None) -> int:
    """``python -m chaoslib_infer.lab.gateways.sync --state-dir DIR [--interval-s 0.1]``."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--state-dir", type=Path, required=True)
    p.add_argument("--interval-s", type=float, default=0.1)
    a = p.parse_args(argv)
    from chaoslib_infer.lab.haproxy import servers_state

    sd = a.state_dir.resolve()
    log = sd / SYNC_LOG
    last: list[dict[str, str]] | None = None
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    from chaoslib_infer.lab.statedir import LAB_FILE

    try:
        meta = json.loads((sd / LAB_FILE).read_text())
    except (OSError, ValueError):
        meta = {}
    if meta.get("lanes"):
        _lanes_loop(sd, sorted(meta["lanes"]), a.interval_s, stop)
        return 0
    while not stop["now"]:
        try:
            servers = in_service(servers_state(sd / "haproxy.sock", "engines"))
        except OSError:
            time.sleep(a.interval_s)
            continue
        if last is None:  # the start: nginx runs the config the lab rendered
            last = servers
            _append(
                log, {"t": time.time(), "event": "start", "servers": [s["name"] for s in servers]}
            )
        elif servers != last:
            t0 = time.monotonic()
            rec: dict[str, Any] = {"t": time.time(), "servers": [s["name"] for s in servers]}
            try:
                sync_once(sd, servers)
                rec["ok"] = True
                last = servers
            except Exception as exc:  # keep the old config; say why
                rec.update(ok=False, error=str(exc).splitlines()[0] if str(exc) else repr(exc))
                last = servers
            rec["reload_s"] = round(time.monotonic() - t0, 4)
            _append(log, rec)
        time.sleep(a.interval_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
