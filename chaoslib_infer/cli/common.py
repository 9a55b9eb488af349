"""What the command groups share: the error exit, the lab state folder, the drills' experiments
folder, the ``--gateway``/``--gateway-config`` options."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

import click

__all__ = [
    "DEFAULT_LAB_DIR",
    "GATEWAY_CHOICE",
    "apply_gateway",
    "experiments_dir",
    "fail",
    "gateway_options",
    "k8s_target_file",
    "packed_options",
]

DEFAULT_LAB_DIR = Path(".chaos-infer/lab")


def fail(msg: str, code: int = 2) -> None:
    """Print ``chaos-infer: error: MSG`` on stderr and exit with ``code`` (2: bad input).

    Raises:
        SystemExit: always.
    """
    click.echo(f"chaos-infer: error: {msg}", err=True)
    sys.exit(code)


def experiments_dir() -> Path:
    """The drills' experiments: ``$CHAOS_INFER_EXPERIMENTS`` or the checkout's ``experiments/``."""
    import os

    env = os.environ.get("CHAOS_INFER_EXPERIMENTS")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "experiments"


def k8s_target_file(value: str | None) -> Path | None:
    """``--target`` naming a ``*.yaml``/``*.yml`` file (not a URL): a Kubernetes target file."""
    if value and "://" not in value and value.lower().endswith((".yaml", ".yml")):
        return Path(value)
    return None


GATEWAY_CHOICE = click.Choice(["haproxy", "nginx", "litellm"])
GATEWAY_HELP = (
    "The lab's gateway on its URL: haproxy (the lab's settings, or your haproxy.cfg), nginx "
    "(Debian's) or litellm "
    "(LiteLLM's proxy: scripts/quickstart litellm), each with --gateway-config or the "
    "project's default; docs/gateways.md."
)
GATEWAY_CONFIG_HELP = (
    "The gateway's config, a Jinja2 template over the lab's replicas. nginx: a full "
    "nginx.conf, server blocks or a location snippet ({{ upstream }}, {{ servers }}, "
    "{{ listen }}, {{ lab_http }}); litellm: a proxy config.yaml ({{ replicas }}, "
    "{{ model_list }}, {{ service }}; without model_list it gets the lab's); haproxy: a "
    "haproxy.cfg with a frontend on {{ listen }} and backend engines ({{ server_lines }}, "
    "{{ servers }}; the lab injects its runtime socket and request log); docs/gateways.md."
)


def gateway_options(default: str | None = None, show_default: bool = False) -> Any:
    """The ``--gateway`` / ``--gateway-config`` options, one decorator for every command.

    Args:
        default: ``--gateway``'s default: None for gameday and drill run (the plan's lab:
            decides), ``"haproxy"`` for lab up.
        show_default: show the default in ``--help``.

    Returns:
        A decorator adding ``--gateway`` then ``--gateway-config`` (the order of ``--help``).
    """

    def decorate(func: Any) -> Any:
        func = click.option(
            "--gateway-config",
            type=click.Path(path_type=Path, dir_okay=False, exists=True),
            default=None,
            help=GATEWAY_CONFIG_HELP,
        )(func)
        return click.option(
            "--gateway",
            type=GATEWAY_CHOICE,
            default=default,
            show_default=show_default,
            help=GATEWAY_HELP,
        )(func)

    return decorate


def packed_options(cls: Any, name: str, options: Sequence[Callable[[Any], Any]]) -> Any:
    """A decorator adding click ``options`` (listed in ``--help`` order) whose values reach the
    command as one keyword argument ``name``: ``cls(**values)``, ``cls`` a dataclass whose fields
    are the options' parameter names.

    Returns:
        The decorator (command function -> command function with the options).
    """
    names = [f.name for f in fields(cls)]

    def decorate(func: Any) -> Any:
        @functools.wraps(func)
        def packed(*args: Any, **kwargs: Any) -> Any:
            kwargs[name] = cls(**{n: kwargs.pop(n) for n in names})
            return func(*args, **kwargs)

        command: Any = packed
        for option in reversed(options):
            command = option(command)
        return command

    return decorate


def apply_gateway(the_plan: Any, gateway: str | None, gateway_config: Path | None) -> None:
    """Put ``--gateway`` / ``--gateway-config`` into the plan's ``lab:`` options."""
    if gateway is not None:
        the_plan.lab.options["gateway"] = gateway
        if gateway == "haproxy":
            the_plan.lab.options.pop("gateway_config", None)
    if gateway_config is not None:
        the_plan.lab.options["gateway_config"] = str(gateway_config.resolve())
        if the_plan.lab.options.get("gateway", "haproxy") == "haproxy":
            # your haproxy.cfg decides HAProxy's retries, not the plan's lab setting
            the_plan.lab.options.pop("gateway_retry", None)
