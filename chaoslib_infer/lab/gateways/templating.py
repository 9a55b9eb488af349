"""The gateways' config templates: the user's config, or the project's default, as Jinja2.

``StrictUndefined`` (an unknown variable is one clear error), no autoescaping (the output is
nginx configuration or YAML, not HTML), the project's templates in ``templates/``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2

from chaoslib_infer.errors import InferChaosError

__all__ = ["TEMPLATES", "environment", "render"]

TEMPLATES = Path(__file__).with_name("templates")


def environment() -> jinja2.Environment:
    """The Jinja2 environment of the gateway templates (module docstring)."""
    return jinja2.Environment(
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,  # gateway configuration, not HTML  # noqa: S701
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
    )


def render(
    user_config: str | None,
    default: str,
    variables: dict[str, Any],
    source: str,
    error: type[InferChaosError],
) -> str:
    """Render ``user_config`` (a template's text), or the project's template ``default`` when it
    is None, with ``variables``.

    Raises:
        error: a template error, one line: ``"<source>[ line N]: template error: <what>"``.
    """
    env = environment()
    try:
        if user_config is None:
            return env.get_template(default).render(**variables)
        return env.from_string(user_config).render(**variables)
    except jinja2.TemplateError as exc:
        line = getattr(exc, "lineno", None)
        where = f" line {line}" if line else ""
        raise error(f"{source}{where}: template error: {exc}") from None
