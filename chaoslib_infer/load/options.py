"""The load settings: one table of names, types, defaults and help (:data:`LOAD_SETTINGS`).

Every setting of the drills' background load is one row here, and the row is all the code it
needs to reach the operator:

* an experiment's configuration key ``load_<name>`` (:data:`VAR_PREFIX`), which the
  background-load control (:mod:`chaoslib_infer.controls.load`) reads over its own arguments, so
  ``chaos run --var load_retry_attempts=3`` and a plan's ``vars: {load_retry_attempts: 3}`` set
  it on every shipped experiment;
* a command-line option of ``chaos-infer gameday`` and ``drill run`` (``--load-retry-attempts
  3``: the name with dashes, :func:`cli_flag`);
* the load generator's own flag (``python -m chaoslib_infer.load --retry-attempts 3``: the row's
  ``flag``), written by :func:`load_argv`.

Values come as YAML values (plans, experiments) or as text (``--var``, the command line, an
environment variable); :func:`parse_setting` reads both into one canonical value and refuses a
bad one with a one-line :class:`ValueError` naming the setting. Names and meanings:
``docs/definitions.md``, "Load settings".
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .attempts import ERROR_CLASSES
from .mix import format_mix, parse_prompt_mix
from .schedule import check_profile, parse_profile
from .spec import DEFAULT_RETRY_ON

__all__ = [
    "LOAD_SETTINGS",
    "RETRY_ON_GROUPS",
    "VAR_PREFIX",
    "LoadSetting",
    "choice",
    "cli_flag",
    "load_argv",
    "load_vars",
    "parse_setting",
    "parse_var",
    "setting_text",
]

#: configuration keys (experiment ``configuration:``, plan ``vars:``, ``chaos run --var``) of the
#: load settings: ``load_`` + the setting's name
VAR_PREFIX = "load_"

#: names ``retry_on`` takes beside the error classes (``attempts.ERROR_CLASSES``), each standing
#: for the classes of one kind of failure: a stream cut after its 200 (the connection reset, the
#: stream ended without ``[DONE]``, or it stopped sending for ``idle_timeout_s``), and a connect
#: error (refused, or no answer within the connect timeout)
RETRY_ON_GROUPS: dict[str, tuple[str, ...]] = {
    "cut_stream": ("reset", "truncated", "timeout_idle"),
    "connect_error": ("connect", "timeout_connect"),
}

_NONE_TEXT = ("", "none", "null")
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an RFC 9110 token


def _is_none(value: Any) -> bool:
    return value is None or (isinstance(value, str) and value.strip().lower() in _NONE_TEXT)


def _number(value: Any) -> float:
    """A finite number from a YAML number or its text; ValueError otherwise (bools refused)."""
    if isinstance(value, bool):
        raise ValueError
    number = float(value.strip() if isinstance(value, str) else value)
    if not math.isfinite(number):
        raise ValueError
    return number


def _positive(value: Any) -> float:
    try:
        number = _number(value)
    except (TypeError, ValueError):
        number = -1.0
    if number <= 0:
        raise ValueError(f"expected a number > 0, got {value!r}")
    return number


def _positive_or_auto(value: Any) -> float | str:
    """``"auto"`` (any case, spaces around) as ``"auto"``, else :func:`_positive`."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    return _positive(value)


def _non_negative(value: Any) -> float:
    try:
        number = _number(value)
    except (TypeError, ValueError):
        number = -1.0
    if number < 0:
        raise ValueError(f"expected a number of seconds >= 0, got {value!r}")
    return number


def _optional_positive(value: Any) -> float | None:
    return None if _is_none(value) else _positive(value)


def _limit(value: Any) -> float | None:
    """A client timeout: a number of seconds > 0, or 0 / none for no limit (None)."""
    if _is_none(value) or (isinstance(value, str) and value.strip().lower() == "off"):
        return None
    return _non_negative(value) or None


def _optional_non_negative(value: Any) -> float | None:
    return None if _is_none(value) else _non_negative(value)


def _optional_int_ge0(value: Any) -> int | None:
    if _is_none(value):
        return None
    try:
        number = _number(value)
    except (TypeError, ValueError):
        number = -1.0
    if number < 0 or number != int(number):
        raise ValueError(f"expected an integer >= 0, got {value!r}")
    return int(number)


def _count(value: Any) -> int:
    try:
        number = _number(value)
    except (TypeError, ValueError):
        number = 0.0
    if number < 1 or number != int(number):
        raise ValueError(f"expected an integer >= 1, got {value!r}")
    return int(number)


def _optional_count(value: Any) -> int | None:
    return None if _is_none(value) else _count(value)


def _optional_int(value: Any) -> int | None:
    if _is_none(value):
        return None
    try:
        number = _number(value)
    except (TypeError, ValueError):
        number = 0.5
    if number != int(number):
        raise ValueError(f"expected an integer, got {value!r}")
    return int(number)


def _profile(value: Any) -> list[list[float]] | None:
    if _is_none(value):
        return None
    phases = parse_profile(value) if isinstance(value, str) else check_profile(value)
    return [[d, r] for d, r in phases]


def _mix(value: Any) -> str | None:
    return None if _is_none(value) else format_mix(parse_prompt_mix(value))


def _retry_on(value: Any) -> list[str]:
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not items:
        raise ValueError(f"expected a list of error classes, got {value!r}")
    out: list[str] = []
    for item in items:
        name = str(item).strip()
        if name in RETRY_ON_GROUPS:
            out += RETRY_ON_GROUPS[name]
        elif name in ERROR_CLASSES:
            out.append(name)
        elif name:
            known = [*RETRY_ON_GROUPS, *ERROR_CLASSES]
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"unknown error class {name!r}{hint}; known: {', '.join(known)}")
    if not out:
        raise ValueError(f"expected a list of error classes, got {value!r}")
    return list(dict.fromkeys(out))


def choice(*values: str) -> Callable[[Any], str]:
    """A parser for a setting that takes one of ``values`` (e.g. ``choice("raw", "openai-sdk")``
    for a row ``client``); anything else is a one-line ValueError listing them."""

    def parse(value: Any) -> str:
        text = value.strip() if isinstance(value, str) else value
        if text not in values:
            raise ValueError(f"expected one of {', '.join(values)}, got {value!r}")
        return str(text)

    return parse


def _header(value: Any) -> str | None:
    if _is_none(value):
        return None
    name = str(value).strip() if isinstance(value, str) else value
    if not isinstance(name, str) or not _HEADER_NAME.match(name):
        raise ValueError(f"expected an HTTP header name, e.g. Idempotency-Key, got {value!r}")
    if name.lower() in ("x-request-id", "content-length", "transfer-encoding", "host"):
        raise ValueError(f"{name} is a header the load client sets itself")
    return name


@dataclass(frozen=True)
class LoadSetting:
    """One load setting.

    Attributes:
        name: the name (``start_load``'s argument; ``load_<name>`` in configuration).
        parse: reads a YAML value or its text into the canonical value; ValueError (one line).
        default: the value when nobody sets it (``start_load``'s default).
        help: what it sets, its unit, and what None means.
        metavar: how the command line shows its value.
        flag: the load generator's flag (``python -m chaoslib_infer.load``), or None when the
            setting is the control's own (``warmup_s``).
        shipped: what the shipped drills' experiments set, where none of them runs with
            ``default`` (``--help`` says it first: a user of ``gameday`` gets that, not
            ``default``, which only an experiment that sets nothing gets); None: ``default``.
    """

    name: str
    parse: Callable[[Any], Any]
    default: Any
    help: str
    metavar: str
    flag: str | None
    shipped: str | None = None

    @property
    def var(self) -> str:
        """The configuration key: ``load_<name>``."""
        return VAR_PREFIX + self.name


#: Every load setting, in the order ``--help`` and the docs list them.
LOAD_SETTINGS: tuple[LoadSetting, ...] = (
    LoadSetting("rate_rps", _positive, 8.0,
                "mean open-loop arrival rate, requests/s (Poisson arrivals)", "RPS", "--rate"),
    LoadSetting("profile", _profile, None,
                "rate phases replacing rate_rps: [[duration_s, rate_rps], ...] or "
                "'12:8,15:28,12:8'; none: a constant rate", "D:R,...", "--profile"),
    LoadSetting("max_concurrency", _optional_count, None,
                "in-flight cap on logical requests (one due while it is full is recorded "
                "not_sent); none: sized from the plan, at least 1000", "N", "--max-concurrency"),
    LoadSetting("max_tokens", _count, 24, "output tokens asked per request", "N", "--max-tokens"),
    LoadSetting("prompt_mix", _mix, None,
                "prompt-length mix, 'short:70,mid:25,long:5' or '64:80,2048:20' (word counts); "
                "none: 16-word prompts", "CLASS:W,...", "--prompt-mix"),
    LoadSetting("timeout_s", _positive, 15.0,
                "client's total limit of one attempt, seconds (when attempt_timeout_s is none)",
                "S", "--timeout-s"),
    LoadSetting("attempt_timeout_s", _optional_positive, None,
                "client's total limit of each attempt, seconds (timeout_total); none: timeout_s",
                "S", "--attempt-timeout-s"),
    LoadSetting("ttft_timeout_s", _limit, 10.0,
                "client's limit from send to the first output chunk, seconds (timeout_ttft); "
                "0 or none: no limit", "S", "--ttft-timeout-s"),
    LoadSetting("idle_timeout_s", _limit, 5.0,
                "client's limit between output chunks, seconds (timeout_idle); 0 or none: no "
                "limit", "S", "--idle-timeout-s"),
    LoadSetting("retry_attempts", _count, 1,
                "attempts per logical request, the first included (1: no retry)", "N",
                "--retry-attempts"),
    LoadSetting("retry_backoff_s", _non_negative, 0.2,
                "base backoff before a retry, seconds (doubled per retry, +-20 % seeded jitter)",
                "S", "--retry-backoff-s"),
    LoadSetting("retry_on", _retry_on, list(DEFAULT_RETRY_ON),
                "failures a retry follows: error classes, or cut_stream (reset, truncated, "
                "timeout_idle) and connect_error (connect, timeout_connect)", "A,B,...",
                "--retry-on"),
    LoadSetting("idempotency_header", _header, None,
                "header carrying the logical request id on every attempt (the same on its "
                "retries), for a gateway that deduplicates, e.g. Idempotency-Key; none: not "
                "sent", "NAME", "--idempotency-header"),
    LoadSetting("retry_after_max_s", _optional_non_negative, None,
                "honour a Retry-After of a failed attempt's answer up to this many seconds (the "
                "retry waits the longer of it and its backoff); none: ignored", "S",
                "--retry-after-max-s"),
    LoadSetting("client", choice("raw", "openai-sdk"), "raw",
                "who sends the requests: raw (ours, kernel-stamped chunk times) or openai-sdk (the "
                "official openai package, its own retries: retry_attempts stays 1)", "NAME",
                "--client"),
    LoadSetting("sdk_max_retries", _optional_int_ge0, None,
                "client openai-sdk: its max_retries; none: the SDK's default (2)", "N",
                "--sdk-max-retries"),
    LoadSetting("sdk_timeout_s", _optional_positive, None,
                "client openai-sdk: its request timeout, seconds; none: the SDK's (600 s)", "S",
                "--sdk-timeout-s"),
    LoadSetting("seed", _optional_int, None,
                "seed of the arrival schedule and prompt words; none: the generator's (0)", "N",
                "--seed"),
    LoadSetting("warmup_s", _positive_or_auto, 6.0,
                "seconds the load runs before the first steady-state hypothesis; auto: long "
                "enough for a baseline that catches a 2 % defect (docs/definitions.md, 'Windows "
                "with stated error rates')", "S|auto", None,
                "auto in the shipped drills (traffic-spike's lab experiment: 8)"),
)  # fmt: skip

_BY_NAME = {s.name: s for s in LOAD_SETTINGS}
_BY_VAR = {s.var: s for s in LOAD_SETTINGS}


def cli_flag(setting: LoadSetting) -> str:
    """The command-line option of ``setting`` on ``gameday`` and ``drill run``: ``--load-`` and
    its name with dashes (``retry_attempts`` -> ``--load-retry-attempts``)."""
    return "--" + setting.var.replace("_", "-")


def parse_setting(name: str, value: Any) -> Any:
    """The canonical value of the load setting ``name`` given ``value`` (a YAML value or text).

    Returns:
        A float (seconds, rates), an int (counts, seed), a list (``profile`` as ``[[d, r]]``,
        ``retry_on`` as error classes, groups expanded), a string (``prompt_mix`` as
        ``CLASS:W,...``, a header name) or None (where the table says what none means).

    Raises:
        ValueError: an unknown name, or a bad value: one line, ``load_<name>: why``.
    """
    setting = _BY_NAME.get(name)
    if setting is None:
        raise ValueError(_unknown(VAR_PREFIX + str(name)))
    try:
        return setting.parse(value)
    except (TypeError, ValueError) as exc:
        why = str(exc) or f"invalid value {value!r}"
        raise ValueError(f"{setting.var}: {why}") from None


def parse_var(key: str, value: Any) -> tuple[str, Any]:
    """``(name, canonical value)`` of a configuration key ``load_<name>`` and its value.

    Raises:
        ValueError: ``key`` names no load setting (the closest one suggested), or a bad value.
    """
    setting = _BY_VAR.get(key)
    if setting is None:
        raise ValueError(_unknown(key))
    return setting.name, parse_setting(setting.name, value)


def _unknown(key: str) -> str:
    close = difflib.get_close_matches(key, list(_BY_VAR), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"{key}: no such load setting{hint}; known: {', '.join(_BY_VAR)}"


def load_vars(config: Mapping[str, Any]) -> dict[str, Any]:
    """The load settings a configuration (or a plan's ``vars:``) sets: ``{name: value}`` for
    every key ``load_<name>`` of the table, parsed; other keys are left out (a drill's own
    ``load_*`` keys that are not settings too, e.g. ``load_max_duration_s`` of a tool
    experiment: the experiment itself wires them).

    Raises:
        ValueError: a bad value (one line naming ``load_<name>``).
    """
    return {s.name: parse_setting(s.name, config[s.var]) for s in LOAD_SETTINGS if s.var in config}


def setting_text(name: str, value: Any) -> str:
    """``value`` of setting ``name`` as one short text (dry run, docs): ``none``, ``12:8,15:28``,
    ``connect,http_5xx``, ``0.2``."""
    if value is None:
        return "none"
    if name == "profile":
        return ",".join(f"{d:g}:{r:g}" for d, r in value)
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def load_argv(values: Mapping[str, Any]) -> list[str]:
    """The load generator's arguments for the settings in ``values`` (``{name: canonical
    value}``; names outside the table, and settings without a generator flag, are skipped).

    A client timeout of None is written 0 (no limit); another None is left out (the
    generator's default: none).
    """
    argv: list[str] = []
    for setting in LOAD_SETTINGS:
        if setting.flag is None or setting.name not in values:
            continue
        value = values[setting.name]
        if value is None and setting.parse is _limit:
            value = 0.0
        if value is None:
            continue
        if setting.name == "profile":
            text = ",".join(f"{float(d)!r}:{float(r)!r}" for d, r in value)
        elif isinstance(value, float):
            text = repr(value)
        else:
            text = setting_text(setting.name, value)
        argv += [setting.flag, text]
    return argv
