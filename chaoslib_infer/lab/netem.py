"""``tc netem`` command builder and kernel detection (latency, jitter and loss on a link).

The real mechanism for the network-jitter drill where the kernel has the ``netem`` qdisc: a root
qdisc on the replica's link device, inside the replica's network namespace when the lab runs its
replicas in namespaces ("nodes"), or inside a Kubernetes pod's network namespace later. This module
only *builds* argument lists (pure, unit-tested against tc's grammar) and detects whether netem
works on this kernel; running them is the caller's business (:mod:`chaoslib_infer.activities.network`).

tc's grammar (``man tc-netem``), the subset built here::

    tc qdisc add dev DEV root netem delay TIME [JITTER [CORRELATION]]
        [distribution {uniform|normal|pareto|paretonormal}] [loss [random] PERCENT [CORRELATION]]
    tc qdisc del dev DEV root

``distribution`` is only valid with a jitter (tc refuses it otherwise), and so is the delay
correlation. Times are written in milliseconds (``100ms``, ``0.5ms``), percentages with ``%``.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import threading
from typing import Any

from chaoslib_infer.safety.redact import child_env

__all__ = [
    "NETEM_DISTRIBUTIONS",
    "netem_add_args",
    "netem_available",
    "netem_del_args",
    "netem_pod_exec",
    "netem_probe",
    "netem_show_args",
    "tc_netem_args",
]

NETEM_DISTRIBUTIONS = ("uniform", "normal", "pareto", "paretonormal")
_DEV = re.compile(r"^[A-Za-z0-9_.@:-]{1,15}$")  # IFNAMSIZ - 1, no whitespace or slash
_NETNS = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_PROBE_TIMEOUT_S = 5.0
_cache: tuple[bool, str] | None = None
_lock = threading.Lock()


def _ms(value: float, what: str) -> str:
    v = float(value)
    if not v >= 0 or v == float("inf"):
        raise ValueError(f"{what} must be a finite number of ms >= 0, got {value!r}")
    return f"{int(v)}ms" if v == int(v) else f"{v:g}ms"


def _pct(value: float, what: str) -> str:
    v = float(value)
    if not 0 <= v <= 100:
        raise ValueError(f"{what} must be a percentage in [0, 100], got {value!r}")
    return f"{int(v)}%" if v == int(v) else f"{v:g}%"


def _check_dev(dev: str) -> str:
    if not isinstance(dev, str) or not _DEV.match(dev):
        raise ValueError(f"bad network device name {dev!r}")
    return dev


def _prefix(netns: str | None) -> list[str]:
    if netns is None:
        return []
    if not isinstance(netns, str) or not _NETNS.match(netns):
        raise ValueError(f"bad network namespace name {netns!r}")
    return ["ip", "netns", "exec", netns]


def tc_netem_args(
    verb: str,
    dev: str,
    delay_ms: float,
    jitter_ms: float = 0.0,
    loss_pct: float = 0.0,
    correlation_pct: float | None = None,
    distribution: str = "normal",
    loss_correlation_pct: float | None = None,
) -> list[str]:
    """The ``tc qdisc {add|change|replace} dev DEV root netem ...`` argv (no namespace prefix).

    This is the builder every variant shares (host namespace, ``ip netns exec``, pod exec).

    Args:
        verb: ``"add"``, ``"change"`` or ``"replace"``.
        dev: network device (``eth0``, ``veth-r0``...).
        delay_ms: mean added delay, milliseconds (>= 0).
        jitter_ms: jitter, milliseconds (0: none; then no distribution or correlation is written).
        loss_pct: random packet loss, percent (0: no ``loss`` clause).
        correlation_pct: delay correlation, percent (needs a jitter).
        distribution: one of :data:`NETEM_DISTRIBUTIONS` (written only with a jitter).
        loss_correlation_pct: loss correlation, percent (needs a loss).

    Returns:
        The argv, e.g. ``["tc", "qdisc", "add", "dev", "eth0", "root", "netem", "delay", "100ms",
        "20ms", "distribution", "normal", "loss", "1%"]``.

    Raises:
        ValueError: bad verb, device, distribution, negative times, percentages outside 0..100,
            a correlation without the jitter or loss it correlates.
    """
    if verb not in ("add", "change", "replace"):
        raise ValueError(f"verb must be add, change or replace, got {verb!r}")
    if distribution not in NETEM_DISTRIBUTIONS:
        raise ValueError(
            f"unknown netem distribution {distribution!r}; known: {', '.join(NETEM_DISTRIBUTIONS)}"
        )
    args = ["tc", "qdisc", verb, "dev", _check_dev(dev), "root", "netem"]
    args += ["delay", _ms(delay_ms, "delay_ms")]
    jitter = float(jitter_ms)
    if jitter < 0:
        raise ValueError(f"jitter_ms must be >= 0, got {jitter_ms!r}")
    if jitter > 0:
        args.append(_ms(jitter, "jitter_ms"))
        if correlation_pct is not None:
            args.append(_pct(correlation_pct, "correlation_pct"))
        args += ["distribution", distribution]
    elif correlation_pct is not None:
        raise ValueError("correlation_pct needs a jitter (tc: delay TIME JITTER CORRELATION)")
    loss = float(loss_pct)
    if loss > 0:
        args += ["loss", _pct(loss, "loss_pct")]
        if loss_correlation_pct is not None:
            args.append(_pct(loss_correlation_pct, "loss_correlation_pct"))
    elif loss < 0:
        raise ValueError(f"loss_pct must be in [0, 100], got {loss_pct!r}")
    elif loss_correlation_pct is not None:
        raise ValueError("loss_correlation_pct needs a loss_pct > 0")
    return args


def netem_add_args(
    dev: str,
    delay_ms: float,
    jitter_ms: float,
    loss_pct: float = 0,
    correlation_pct: float | None = None,
    distribution: str = "normal",
    netns: str | None = None,
) -> list[str]:
    """argv adding a netem root qdisc on ``dev``, inside ``netns`` when given.

    Example: ``netem_add_args("veth-r0", 100, 20, 1, netns="node-a")`` ->
    ``["ip", "netns", "exec", "node-a", "tc", "qdisc", "add", "dev", "veth-r0", "root", "netem",
    "delay", "100ms", "20ms", "distribution", "normal", "loss", "1%"]``.

    Raises:
        ValueError: see :func:`tc_netem_args`; a bad namespace name.
    """
    return _prefix(netns) + tc_netem_args(
        "add", dev, delay_ms, jitter_ms, loss_pct, correlation_pct, distribution
    )


def netem_del_args(dev: str, netns: str | None = None) -> list[str]:
    """argv removing the root qdisc of ``dev`` (back to the default), inside ``netns`` when given.

    Raises:
        ValueError: bad device or namespace name.
    """
    return _prefix(netns) + ["tc", "qdisc", "del", "dev", _check_dev(dev), "root"]


def netem_show_args(dev: str, netns: str | None = None) -> list[str]:
    """argv listing the qdiscs of ``dev`` (``... netem ...`` in the output while one is active).

    Raises:
        ValueError: bad device or namespace name.
    """
    return _prefix(netns) + ["tc", "qdisc", "show", "dev", _check_dev(dev)]


def netem_pod_exec(
    pod: str,
    namespace: str,
    delay_ms: float,
    jitter_ms: float,
    loss_pct: float = 0,
    correlation_pct: float | None = None,
    distribution: str = "normal",
    dev: str = "eth0",
    container: str | None = None,
    remove: bool = False,
) -> dict[str, Any]:
    """Keyword arguments of a Kubernetes pod exec running the same tc command in the pod.

    Use with the official client: ``kubernetes.stream.stream(core_v1.connect_get_namespaced_pod_exec,
    **netem_pod_exec(...), stderr=True, stdout=True, stdin=False, tty=False)``. The container needs
    ``tc`` (iproute2) and ``CAP_NET_ADMIN``, usually a debug/sidecar container sharing the pod's
    network namespace.

    Args:
        pod: pod name. namespace: Kubernetes namespace. dev: the pod's interface (``eth0``).
        container: container to exec in (None: the pod's only container).
        remove: build the ``tc qdisc del`` command instead (the undo).
        delay_ms, jitter_ms, loss_pct, correlation_pct, distribution: see :func:`tc_netem_args`.

    Returns:
        ``{"name", "namespace", "command"[, "container"]}``.

    Raises:
        ValueError: see :func:`tc_netem_args`; empty pod or namespace.
    """
    if not pod or not namespace:
        raise ValueError("pod and namespace are required")
    command = (
        netem_del_args(dev)
        if remove
        else tc_netem_args("add", dev, delay_ms, jitter_ms, loss_pct, correlation_pct, distribution)
    )
    out: dict[str, Any] = {"name": pod, "namespace": namespace, "command": command}
    if container:
        out["container"] = container
    return out


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args,
        capture_output=True,
        text=True,
        timeout=_PROBE_TIMEOUT_S,
        check=False,
        env=child_env(),
    )


def _probe() -> tuple[bool, str]:
    if shutil.which("tc") is None or shutil.which("ip") is None:
        return False, "tc or ip (iproute2) not installed"
    if os.geteuid() != 0:
        return False, "netem needs root (CAP_NET_ADMIN)"
    ns = f"cinf-netem-probe-{os.getpid()}-{os.urandom(3).hex()}"
    try:
        made = _run(["ip", "netns", "add", ns])
        if made.returncode != 0:
            return False, f"cannot create a network namespace: {made.stderr.strip()[:200]}"
        veth = _run(
            ["ip", "-n", ns, "link", "add", "cinfp0", "type", "veth", "peer", "name", "cinfp1"]
        )
        if veth.returncode != 0:
            return False, f"cannot create a veth pair: {veth.stderr.strip()[:200]}"
        tried = _run(netem_add_args("cinfp0", 1, 0, netns=ns))
        if tried.returncode != 0:
            reason = (tried.stderr or tried.stdout).strip().splitlines()
            return False, f"tc netem refused: {reason[-1] if reason else tried.returncode}"
        return True, "tc netem works (probe in a throwaway network namespace)"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"netem probe failed: {exc}"
    finally:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            _run(["ip", "netns", "del", ns])


def netem_probe(refresh: bool = False) -> tuple[bool, str]:
    """Whether the kernel accepts a netem qdisc, and why (cached per process).

    The probe creates a throwaway network namespace with a veth pair, runs ``tc qdisc add dev
    <veth> root netem delay 1ms`` there and deletes the namespace (so nothing outside it is
    touched). It needs root, ``ip`` and ``tc``.

    Args:
        refresh: probe again instead of answering from the cache.

    Returns:
        ``(available, reason)``; reason is a one-line explanation (tc's own error when refused).
    """
    global _cache
    with _lock:
        if _cache is None or refresh:
            _cache = _probe()
        return _cache


def netem_available() -> bool:
    """True when this kernel has a working ``netem`` qdisc (see :func:`netem_probe`; cached)."""
    return netem_probe()[0]
