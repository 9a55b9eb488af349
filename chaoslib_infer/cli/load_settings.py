"""The load settings on the command line of ``gameday`` and ``drill run``: one option per row of
:data:`chaoslib_infer.load.options.LOAD_SETTINGS` (``--load-retry-attempts 3``), generated from
the table, so a setting added there is an option here with no more code.

The options reach the command as one keyword argument, ``load_vars`` (``{load_<name>: value}``,
each value read by :func:`~chaoslib_infer.load.options.parse_setting`), which
:func:`apply_load_vars` puts into every drill's ``vars`` over the plan's.
"""

from __future__ import annotations

import functools
from typing import Any

import click

from .common import fail

__all__ = ["apply_load_vars", "default_help", "load_options"]


def load_options(func: Any) -> Any:
    """Add ``--load-<name> VALUE`` for every load setting (in the table's order); the command
    receives ``load_vars``. A bad value exits 2 with one line naming the option, before anything
    starts."""
    from chaoslib_infer.load.options import LOAD_SETTINGS, cli_flag, parse_setting

    params = {s.var: s for s in LOAD_SETTINGS}

    @functools.wraps(func)
    def packed(*args: Any, **kwargs: Any) -> Any:
        load_vars: dict[str, Any] = {}
        for var, setting in params.items():
            text = kwargs.pop(var, None)
            if text is None:
                continue
            try:
                load_vars[var] = parse_setting(setting.name, text)
            except ValueError as exc:
                fail(f"{cli_flag(setting)}: {str(exc).partition(': ')[2]}")
        kwargs["load_vars"] = load_vars
        return func(*args, **kwargs)

    command: Any = packed
    for setting in reversed(LOAD_SETTINGS):
        command = click.option(
            cli_flag(setting),
            setting.var,
            default=None,
            metavar=setting.metavar,
            help=f"Load setting {setting.name}: {setting.help} ({default_help(setting)}). Every "
            "drill; docs/definitions.md, 'Load settings'.",
        )(command)
    return command


def default_help(setting: Any) -> str:
    """What ``--help`` says of a load setting's default: the table's, or, where no shipped
    drill runs with it, what the shipped drills set first (``LoadSetting.shipped``)."""
    default = "none" if setting.default is None else _text(setting.name, setting.default)
    if setting.shipped:
        return f"default {setting.shipped}; {default} in an experiment that sets none"
    return f"default {default}; the drill's experiment may set its own"


def _text(name: str, value: Any) -> str:
    from chaoslib_infer.load.options import setting_text

    return setting_text(name, value)


def apply_load_vars(the_plan: Any, load_vars: dict[str, Any]) -> None:
    """Put the command line's load settings into every drill's ``vars`` (over the plan's)."""
    for spec in the_plan.drills:
        spec.vars.update(load_vars)
