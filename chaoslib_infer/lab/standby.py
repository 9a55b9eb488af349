"""Standby replicas and the autoscaler's configuration: ``Lab.up``'s scaling options, the
standby servers of haproxy.cfg and the ``[program:autoscaler]`` block of supervisord.conf.

What standby replicas are and what the autoscaler does is told in
:mod:`chaoslib_infer.lab.scaling` (which re-exports these names). A leaf module: the lab's
lifecycle uses it while the lab is being configured, before any ``Lab`` exists.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from chaoslib_infer.lab.statedir import LabError

__all__ = [
    "QUEUE_SAMPLES",
    "SAMPLE_S",
    "mark_standby_servers",
    "scaling_options",
    "supervisor_program",
]

#: Queue-depth samples of the autoscaler, in the lab's state directory.
QUEUE_SAMPLES = "queue-depth.jsonl"
#: seconds between two queue-depth samples of the autoscaler
SAMPLE_S = 0.25


# --------------------------------------------------------------------------------------------
# Lab.up options
# --------------------------------------------------------------------------------------------
def scaling_options(
    replicas: int,
    standby: int = 0,
    autoscale: bool = False,
    scale_out_queue: float = 4.0,
    scale_out_after_s: float = 1.0,
    scale_out_cooldown_s: float = 10.0,
    max_replicas: int = 32,
) -> dict[str, Any]:
    """Validate the scaling options of ``Lab.up`` and return them for ``lab.json["scaling"]``.

    Args:
        replicas: serving replicas at start (the lab's initial size).
        standby: replicas configured but not started (0..).
        autoscale: run the ``autoscaler`` program (needs ``standby >= 1``).
        scale_out_queue: queue depth (requests: HAProxy backend queue + engines' waiting requests)
            above which the policy counts the service as overloaded.
        scale_out_after_s: seconds the depth must stay above ``scale_out_queue``.
        scale_out_cooldown_s: seconds between two scale-outs.
        max_replicas: the lab's limit on replicas + standby.

    Returns:
        ``{"standby", "autoscale", "scale_out_queue", "scale_out_after_s", "scale_out_cooldown_s",
        "sample_s"}``.

    Raises:
        LabError: a value out of range, a non-number, or ``autoscale`` without a standby replica.
    """
    if isinstance(standby, bool) or not isinstance(standby, int) or standby < 0:
        raise LabError(f"standby must be an integer >= 0, got {standby!r}")
    if replicas + standby > max_replicas:
        raise LabError(
            f"replicas + standby must be at most {max_replicas}, got {replicas + standby}"
        )
    if not isinstance(autoscale, bool):
        raise LabError(f"autoscale must be true or false, got {autoscale!r}")
    if autoscale and standby < 1:
        raise LabError("autoscale needs at least one standby replica (standby: 1)")
    for name, value in (
        ("scale_out_queue", scale_out_queue),
        ("scale_out_after_s", scale_out_after_s),
        ("scale_out_cooldown_s", scale_out_cooldown_s),
    ):
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise LabError(f"{name} must be a number, got {value!r}")
        if value < 0:
            raise LabError(f"{name} must be >= 0, got {value!r}")
    return {
        "standby": standby,
        "autoscale": autoscale,
        "scale_out_queue": float(scale_out_queue),
        "scale_out_after_s": float(scale_out_after_s),
        "scale_out_cooldown_s": float(scale_out_cooldown_s),
        "sample_s": SAMPLE_S,
    }


def mark_standby_servers(config: str, names: Iterable[str]) -> str:
    """Return haproxy.cfg text with each standby ``server`` line declared ``disabled`` (MAINT).

    Args:
        config: the rendered configuration (``haproxy.render_config``).
        names: standby server names.

    Raises:
        LabError: a name has no ``server`` line in the configuration.
    """
    lines = config.splitlines(keepends=True)
    for name in names:
        hits = [i for i, ln in enumerate(lines) if ln.split()[:2] == ["server", name]]
        if len(hits) != 1:
            raise LabError(f"haproxy.cfg has {len(hits)} 'server {name}' lines, expected 1")
        i = hits[0]
        body = lines[i].rstrip("\n")
        lines[i] = body + " disabled" + lines[i][len(body) :]
    return "".join(lines)


_AUTOSCALER_PROGRAM = """
[program:autoscaler]
command={command}
priority=20
autostart={autostart}
autorestart=true
startsecs=0
stopwaitsecs=2
redirect_stderr=true
stdout_logfile={logs}/autoscaler.log
stdout_logfile_maxbytes=0
"""


def supervisor_program(meta: dict[str, Any], state_dir: Path, command: list[str]) -> str:
    """supervisord ``[program:autoscaler]`` block for ``meta["scaling"]`` ('' without standby).

    Args:
        meta: the lab's ``lab.json`` mapping.
        state_dir: the lab's state directory (logs go to ``state_dir/logs``).
        command: the autoscaler's argv (quoted for supervisord here).

    Returns:
        The block, with ``autostart`` true only when ``autoscale`` is on (so
        ``supervisorctl start autoscaler`` can still turn it on later).
    """
    scaling = meta.get("scaling") or {}
    if not scaling.get("standby"):
        return ""
    return _AUTOSCALER_PROGRAM.format(
        command=shlex.join(command).replace("%", "%%"),
        autostart="true" if scaling.get("autoscale") else "false",
        logs=state_dir / "logs",
    )
