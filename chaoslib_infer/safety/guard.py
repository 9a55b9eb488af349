"""Stop conditions (like AWS FIS stop conditions): when to abort a drill, from the load records.

Two guards, both over the attempts that **completed** in the last ``window_s`` seconds (``end_at``
in ``(now - window_s, now]``; a failure counts when it is decided, which is when the user sees it):

- ``availability_floor``: availability (ok / attempted, ``docs/definitions.md``) below the floor;
- ``max_burn_rate``: error-budget burn rate above the maximum, where
  ``burn_rate = error_rate / (1 - slo_availability)`` (1.0 = spending the budget exactly as fast
  as the SLO allows; with a 99.9 % SLO, a 10 % error rate burns at 100).

A guard trips when its condition has held at every check for ``for_s`` seconds in a row (a check
with fewer than ``min_requests`` completed attempts neither confirms nor clears a breach: a
frozen service that completes nothing does not look healthy). ``for_s = 0`` trips at the first
breaching check. The Chaos Toolkit control :mod:`chaoslib_infer.controls.guard` runs the checks
once a second and aborts the experiment (rollbacks play) when one trips.

A plan may declare them for every drill or per drill (``stop_conditions:`` mapping, keys as in
:class:`StopConditions`); see :func:`plan_stop_conditions`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from chaoslib_infer.errors import ConfigError

__all__ = [
    "RecordTail",
    "StopConditions",
    "Tracker",
    "Trip",
    "hung_samples",
    "plan_stop_conditions",
    "window_figures",
]


@dataclass(frozen=True)
class StopConditions:
    """Thresholds of the stop conditions (``None`` disables a guard).

    Attributes:
        availability_floor: trip when availability (0..1) stays below this.
        max_burn_rate: trip when the error-budget burn rate stays above this.
        window_s: look-back window of each check, seconds.
        for_s: how long a breach must last before the guard trips, seconds.
        slo_availability: the SLO whose error budget burns (default 0.999, docs/definitions.md).
        min_requests: completed attempts a window needs to count as evidence.
        interval_s: seconds between checks.
        hang_s: an attempt still in flight longer than this (the load's in-flight snapshot)
            counts as a failure at each check, so a hang trips a guard without waiting for the
            client's own timeout (10 s first token by default).
    """

    availability_floor: float | None = 0.5
    max_burn_rate: float | None = None
    window_s: float = 5.0
    for_s: float = 3.0
    slo_availability: float = 0.999
    min_requests: int = 5
    interval_s: float = 1.0
    hang_s: float = 5.0

    @classmethod
    def from_mapping(cls, raw: dict[str, Any], where: str = "stop_conditions") -> StopConditions:
        """Build from a plan/control mapping; strings are converted (Chaos Toolkit substitutes
        ``${var}`` as text).

        Raises:
            ConfigError: unknown key, non-numeric value or out-of-range value (message names
                ``where`` and the key).
        """
        if not isinstance(raw, dict):
            raise ConfigError(f"{where}: expected a mapping")
        known = {f.name: f for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        for key, value in raw.items():
            if key not in known:
                raise ConfigError(
                    f"{where}.{key}: unknown stop condition; known: {', '.join(sorted(known))}"
                )
            if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none")):
                if key in ("availability_floor", "max_burn_rate"):
                    values[key] = None
                    continue
                raise ConfigError(f"{where}.{key}: a number is required")
            if isinstance(value, bool):
                raise ConfigError(f"{where}.{key}: expected a number, got {value!r}")
            try:
                num = float(value)
            except (TypeError, ValueError):
                raise ConfigError(f"{where}.{key}: expected a number, got {value!r}") from None
            values[key] = int(num) if key == "min_requests" else num
        conditions = cls(**values)
        conditions.validate(where)
        return conditions

    def validate(self, where: str = "stop_conditions") -> None:
        """Raise :class:`ConfigError` on values out of range."""
        checks = [
            (
                "availability_floor",
                self.availability_floor is None or 0.0 < self.availability_floor <= 1.0,
                "in (0, 1]",
            ),
            ("max_burn_rate", self.max_burn_rate is None or self.max_burn_rate > 0, "> 0"),
            ("window_s", 0 < self.window_s <= 3600, "in (0, 3600]"),
            ("for_s", 0 <= self.for_s <= 3600, "in [0, 3600]"),
            ("slo_availability", 0 < self.slo_availability <= 1.0, "in (0, 1]"),
            ("min_requests", self.min_requests >= 1, ">= 1"),
            ("interval_s", 0.05 <= self.interval_s <= 60, "in [0.05, 60]"),
            ("hang_s", 0 < self.hang_s <= 3600, "in (0, 3600]"),
        ]
        for name, ok, rule in checks:
            value = getattr(self, name)
            if not ok or (isinstance(value, float) and math.isnan(value)):
                raise ConfigError(f"{where}.{name}: must be {rule}, got {value!r}")
        if self.availability_floor is None and self.max_burn_rate is None:
            raise ConfigError(f"{where}: set availability_floor and/or max_burn_rate")


@dataclass
class Trip:
    """A tripped guard: which one, the value that tripped it and when (unix seconds)."""

    guard: str
    value: float
    threshold: float
    at: float
    since: float
    window_s: float
    for_s: float
    requests: int

    def as_dict(self) -> dict[str, Any]:
        """JSON-able form (``summary.json`` drill ``stop_condition``, the journal)."""
        return {
            **dataclasses.asdict(self),
            "reason": self.reason(),
        }

    def reason(self) -> str:
        """One line: ``availability 0.12 < floor 0.5 for 3.0 s (window 5 s, 40 requests)``."""
        if self.guard == "availability_floor":
            what = f"availability {self.value:.3g} < floor {self.threshold:g}"
        else:
            what = f"error-budget burn rate {self.value:.3g} > max {self.threshold:g}"
        return (
            f"{what} for {self.at - self.since:.1f} s "
            f"(window {self.window_s:g} s, {self.requests} requests)"
        )


def window_figures(
    samples: list[tuple[float, bool]] | deque[tuple[float, bool]],
    now: float,
    window_s: float,
    slo_availability: float,
) -> dict[str, Any]:
    """Availability, error rate and burn rate of the attempts that ended in ``(now-window_s, now]``.

    Args:
        samples: ``(end_at unix s, ok)`` per completed attempt.
        now: unix seconds.
        window_s: seconds.
        slo_availability: the availability SLO (0..1] whose budget ``1 - slo`` burns.

    Returns:
        ``{"requests", "ok", "availability", "error_rate", "burn_rate"}``; rates are ``None`` when
        there is no attempt; ``burn_rate`` is ``inf`` with errors and a 100 % SLO.
    """
    start = now - window_s
    n = ok = 0
    for end_at, good in samples:
        if start < end_at <= now:
            n += 1
            ok += 1 if good else 0
    if n == 0:
        return {"requests": 0, "ok": 0, "availability": None, "error_rate": None, "burn_rate": None}
    error_rate = (n - ok) / n
    budget = 1.0 - slo_availability
    if budget <= 0:
        burn = math.inf if error_rate > 0 else 0.0
    else:
        burn = error_rate / budget
    return {
        "requests": n,
        "ok": ok,
        "availability": ok / n,
        "error_rate": error_rate,
        "burn_rate": burn,
    }


class RecordTail:
    """Incremental reader of a growing records file: only complete new lines are parsed.

    Keeps ``(end_at, ok)`` of each attempt for the last ``keep_s`` seconds. A file that shrank
    (replaced) is read again from the start; unparsable lines are skipped.
    """

    def __init__(self, path: Path, keep_s: float) -> None:
        """Watch ``path`` (it may not exist yet) and keep ``keep_s`` seconds of samples."""
        self.path = Path(path)
        self.keep_s = keep_s
        self.offset = 0
        self.samples: deque[tuple[float, bool]] = deque()

    def poll(self, now: float) -> deque[tuple[float, bool]]:
        """Read what was appended since the last call; drop samples older than ``keep_s``."""
        try:
            size = os.stat(self.path).st_size
        except OSError:
            size = 0
        if size < self.offset:
            self.offset = 0
            self.samples.clear()
        if size > self.offset:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read(size - self.offset)
            cut = data.rfind(b"\n")
            if cut >= 0:
                self.offset += cut + 1
                for line in data[: cut + 1].splitlines():
                    sample = _sample(line)
                    if sample is not None:
                        self.samples.append(sample)
        horizon = now - self.keep_s
        # records arrive roughly in end order; drop from the left while old enough
        while self.samples and self.samples[0][0] < horizon:
            self.samples.popleft()
        return self.samples


def hung_samples(
    inflight: list[dict[str, Any]], now: float, hang_s: float
) -> list[tuple[float, bool]]:
    """``(now, False)`` for each in-flight attempt older than ``hang_s`` seconds at ``now``.

    Args:
        inflight: the load's in-flight snapshot (``measure.inflight.read_inflight``).
        now: unix seconds. hang_s: seconds.
    """
    return [
        (now, False)
        for a in inflight
        if isinstance(a.get("sent_at"), int | float) and now - float(a["sent_at"]) > hang_s
    ]


def _sample(line: bytes) -> tuple[float, bool] | None:
    try:
        rec = json.loads(line)
        end_at = rec.get("end_at")
        if end_at is None:
            return None
        end = float(end_at)
        if not math.isfinite(end):
            return None
        return end, bool(rec.get("ok"))
    except (ValueError, TypeError, AttributeError):
        return None


class Tracker:
    """Applies :class:`StopConditions` check after check; remembers when each breach began."""

    def __init__(self, conditions: StopConditions) -> None:
        """Start with no breach."""
        self.conditions = conditions
        self.since: dict[str, float | None] = {"availability_floor": None, "max_burn_rate": None}
        self.last: dict[str, Any] = {}

    def check(
        self, samples: list[tuple[float, bool]] | deque[tuple[float, bool]], now: float
    ) -> Trip | None:
        """One check at unix time ``now``; returns the :class:`Trip` when a guard trips."""
        c = self.conditions
        fig = window_figures(samples, now, c.window_s, c.slo_availability)
        self.last = {**fig, "t": now}
        if fig["requests"] < c.min_requests:
            return None  # not enough evidence either way: keep the breach state as it is
        values = {
            "availability_floor": (fig["availability"], c.availability_floor),
            "max_burn_rate": (fig["burn_rate"], c.max_burn_rate),
        }
        for guard, (value, threshold) in values.items():
            if threshold is None or value is None:
                self.since[guard] = None
                continue
            breach = value < threshold if guard == "availability_floor" else value > threshold
            if not breach:
                self.since[guard] = None
                continue
            since = self.since[guard]
            if since is None:
                since = self.since[guard] = now
            if now - since >= c.for_s:
                return Trip(
                    guard=guard,
                    value=float(value),
                    threshold=float(threshold),
                    at=now,
                    since=since,
                    window_s=c.window_s,
                    for_s=c.for_s,
                    requests=int(fig["requests"]),
                )
        return None


def plan_stop_conditions(plan_path: Path, drill: str) -> dict[str, Any] | None:
    """Stop conditions a plan declares for ``drill``: the top-level ``stop_conditions:`` mapping,
    overridden key by key by the drill's own ``stop_conditions:`` (``None``: none declared;
    ``stop_conditions: false`` on a drill switches them off for it).

    Raises:
        ConfigError: unreadable plan or malformed ``stop_conditions`` (names the file and drill).
    """
    try:
        raw = yaml.safe_load(Path(plan_path).read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise ConfigError(f"{plan_path}: cannot read plan: {exc}") from exc
    if not isinstance(raw, dict):
        return None
    top = raw.get("stop_conditions")
    per: Any = None
    for item in raw.get("drills") or []:
        if isinstance(item, dict) and item.get("name") == drill:
            per = item.get("stop_conditions")
    if per is False:
        return None
    if top is None and per is None:
        return None
    merged: dict[str, Any] = {}
    for where, part in (("stop_conditions", top), (f"drills[{drill}].stop_conditions", per)):
        if part is None:
            continue
        if not isinstance(part, dict):
            raise ConfigError(f"{plan_path}: {where}: expected a mapping")
        merged.update(part)
    StopConditions.from_mapping(merged, f"{plan_path}: stop_conditions")
    return merged
