"""Click's usage errors as the project's one line: ``chaos-infer: error: WHAT (see CMD --help)``,
exit 2 (:func:`.common.fail`), never Click's three-line block (``Usage: ...`` / ``Try ...`` /
``Error: ...``).

Every group and command of ``chaos-infer`` is an :class:`OneLineGroup` / :class:`OneLineCommand`
(a group's subcommands get the class by default): a bad option value, a missing argument, an
unknown option or command is caught where Click raises it (parsing the command line, or
:class:`click.UsageError` from a command's body) and printed as one line. ``--help`` and a group
called without a command (its help) are Click's, unchanged.
"""

from __future__ import annotations

from typing import Any, NoReturn

import click

from .common import fail

__all__ = ["OneLineCommand", "OneLineGroup", "usage_line"]

#: Click >= 8.2 raises this for a group called without a command: its help, not an error.
_HELP_ERRORS: tuple[type[Exception], ...] = tuple(
    t for t in (getattr(click.exceptions, "NoArgsIsHelpError", None),) if t is not None
)


def usage_line(exc: click.UsageError, command_path: str = "chaos-infer") -> str:
    """The one line for a usage error: Click's message (whitespace collapsed, its first letter
    lower case, no final full stop) and where to read more, ``(see CMD --help)``.

    Args:
        exc: the usage error.
        command_path: the command's path (``chaos-infer drill run``), used when the error
            carries no context of its own.
    """
    if exc.ctx is not None:
        command_path = exc.ctx.command_path
    what = " ".join(exc.format_message().split()).rstrip(".")
    if what[:1].isupper() and not what[1:2].isupper():
        what = what[:1].lower() + what[1:]
    return f"{what} (see {command_path} --help)"


def _path(parent: click.Context | None, info_name: str | None) -> str:
    return " ".join(x for x in (parent.command_path if parent else "", info_name or "") if x)


def _refuse(exc: click.UsageError, command_path: str) -> NoReturn:
    if isinstance(exc, _HELP_ERRORS):
        raise exc
    fail(usage_line(exc, command_path or "chaos-infer"), 2)
    raise AssertionError("unreachable")  # fail() exits


class _OneLine:
    """Click's ``make_context`` and ``invoke`` with a usage error refused in one line; mixed into
    a :class:`click.Command` or :class:`click.Group` (before it, so these run first)."""

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        """Click's, with a usage error refused in one line."""
        try:
            return super().make_context(info_name, args, parent=parent, **extra)  # type: ignore[misc]
        except click.UsageError as exc:
            _refuse(exc, _path(parent, info_name))

    def invoke(self, ctx: click.Context) -> Any:
        """Click's (a group's: an unknown command, a subcommand's arguments), with a usage error
        from the command's body refused in one line."""
        try:
            return super().invoke(ctx)  # type: ignore[misc]
        except click.UsageError as exc:
            _refuse(exc, ctx.command_path)


class OneLineCommand(_OneLine, click.Command):
    """A command whose usage errors are one line and exit 2 (module docstring)."""


class OneLineGroup(_OneLine, click.Group):
    """A group whose usage errors (its own and its commands') are one line and exit 2; its
    commands and subgroups are :class:`OneLineCommand` / :class:`OneLineGroup` by default."""

    command_class = OneLineCommand
    group_class = type  # a subgroup: this same class
