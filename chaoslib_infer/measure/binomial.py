"""Steady-state windows judged by an exact binomial test, with their error rates stated.

A window of ``n`` requests meets an SLO that allows a fraction ``a`` of bad requests (availability
0.999: ``a`` = 0.001 failed; error rate 0.001; timeout rate 0.005; P99 <= 10 s: 1 % of the
successful requests over 10 s; P50 <= 2 s: half of them over 2 s) unless its count of bad
requests ``X`` reaches ``k``: the smallest count whose **false-alarm rate** at the SLO,
``P[X >= k | p = a]``, is at most the plan's bound (default 5 %), and never fewer than
:data:`MIN_FAILING` where the SLO allows bad requests at all (``a > 0``). The window's **power** is the
chance it fails a service with a defect, ``P[X >= k | p = d]``; the defect ``d`` is the plan's
defect rate (default 2 % bad requests) or, where the SLO already allows that much (P50), the
allowance plus it. ``docs/definitions.md``, "Windows with stated error rates".

**No cliff at the floor.** With the smallest count alone, a window at 99.9 % fails on one
failure up to 51 requests (false alarm 4.97 %) and needs two from 52 (5.07 % for one): the power
against a 2 % defect fell from 64 % at 51 requests to 28 % at 52, right above the verdict's
50-request floor (one more request, half the power). Any exact test on the count at a fixed
bound steps so (a randomized test would not, but then the same records could pass or fail on a
coin: no verdict a person can act on; a mid-p rule exceeds the bound and still steps). So one bad
request never fails a window whose SLO allows bad requests: the power then rises with every
request from the floor (26 % at 50) to the next step (2 -> 3 at 356 requests: 99.4 % -> 97.4 %).
The steps above the floor are stated, figure by figure, in the docs (:func:`steps`).

**Sized to stay powered** (:func:`required_requests`): the power of a count test falls a little
at each step of ``k`` (a 0.5 % timeout rate: 89.7 % at 395 requests, 80.4 % at 396), so a size
"first reaching 90 %" can be followed by windows that do not: the size is the fewest requests
from which the power stays at or above the target for every larger window up to
:data:`HORIZON` times that size.

The binomial tail is the exact sum of the probability mass (no normal approximation, no scipy):
``P[X >= k] = sum_{i=k}^{n} C(n, i) p^i (1 - p)^(n - i)``, summed on the short side of the mean
from one log-space term (``math.lgamma``) by the ratio of successive terms, so it neither
overflows nor cancels for the window sizes of a drill. Checked against hand-computed values in
``tests/test_binomial.py`` (n = 140 at 99.9 %: one failure or more 13.1 % of the time).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any

__all__ = [
    "DEFAULT_DEFECT",
    "DEFAULT_FALSE_ALARM",
    "DEFAULT_POWER",
    "MAX_REQUESTS",
    "MIN_FAILING",
    "WindowTest",
    "binom_sf",
    "critical_count",
    "defect_rate",
    "power_at",
    "required_requests",
    "plan_settings",
    "steps",
    "window_seconds",
    "judge_window",
]

#: The plan's default bound on a window's false-alarm rate at the SLO (``window_false_alarm``).
DEFAULT_FALSE_ALARM = 0.05
#: The plan's default power target: the chance a window catches the defect (``window_power``).
DEFAULT_POWER = 0.9
#: The plan's default defect: a service that fails 2 % of its requests (``window_defect``).
DEFAULT_DEFECT = 0.02
#: :func:`required_requests` looks no further (a P50 test needs thousands).
MAX_REQUESTS = 20_000
#: The fewest bad requests that fail a window whose SLO allows some (module docstring).
MIN_FAILING = 2
#: :func:`required_requests` checks that the power stays at the target up to this many times
#: the size it returns.
HORIZON = 2
#: The configuration keys (plan ``vars``) of the three settings, and their defaults.
SETTING_KEYS = {
    "window_false_alarm": DEFAULT_FALSE_ALARM,
    "window_power": DEFAULT_POWER,
    "window_defect": DEFAULT_DEFECT,
}


def _log_pmf(i: int, n: int, p: float) -> float:
    return (
        math.lgamma(n + 1)
        - math.lgamma(i + 1)
        - math.lgamma(n - i + 1)
        + i * math.log(p)
        + (n - i) * math.log1p(-p)
    )


def binom_sf(k: int, n: int, p: float) -> float:
    """``P[X >= k]`` for ``X ~ Binomial(n, p)``, the exact sum.

    Args:
        k: a count (any integer: ``k <= 0`` gives 1, ``k > n`` gives 0).
        n: trials, >= 0. p: probability of one trial, in [0, 1].

    Returns:
        The upper tail in [0, 1].

    Raises:
        ValueError: ``n < 0`` or ``p`` outside [0, 1].
    """
    if n < 0 or not 0.0 <= p <= 1.0:
        raise ValueError(f"binomial tail needs n >= 0 and 0 <= p <= 1 (n={n}, p={p})")
    if k <= 0:
        return 1.0
    if k > n or p == 0.0:
        return 0.0
    if p == 1.0:
        return 1.0
    odds = p / (1.0 - p)
    if k > n * p:  # the upper tail is the short side: sum it from k up
        term = math.exp(_log_pmf(k, n, p))
        total, i = 0.0, k
        while i <= n and term > 0.0:
            total += term
            if term < total * 1e-17:
                break
            term *= (n - i) / (i + 1) * odds
            i += 1
        return min(total, 1.0)
    # the lower tail is the short side: 1 - P[X <= k - 1], summed from k - 1 down
    term = math.exp(_log_pmf(k - 1, n, p))
    total, i = 0.0, k - 1
    while i >= 0 and term > 0.0:
        total += term
        if term < total * 1e-17:
            break
        term *= i / (n - i + 1) / odds
        i -= 1
    return max(0.0, 1.0 - total)


def critical_count(n: int, allowance: float, false_alarm: float = DEFAULT_FALSE_ALARM) -> int:
    """The smallest count ``k`` of bad requests whose false-alarm rate at the SLO,
    ``P[X >= k | n, p = allowance]``, is at most ``false_alarm``: a window of ``n`` requests
    fails when it holds ``k`` or more, and ``k >= MIN_FAILING`` where ``allowance > 0`` (one bad
    request is what such an SLO allows: module docstring, "No cliff at the floor"). ``n + 1``
    when no count qualifies (the window cannot fail at this bound: too few requests).

    Raises:
        ValueError: ``n < 0``, a rate outside [0, 1].
    """
    _check_rate("false_alarm", false_alarm)
    _check_rate("allowance", allowance)
    return _critical(n, allowance, false_alarm)


def _critical(n: int, allowance: float, false_alarm: float, start: int = 1) -> int:
    k = max(MIN_FAILING if allowance > 0 else 1, start)
    while k <= n and binom_sf(k, n, allowance) > false_alarm:
        k += 1
    return k


def defect_rate(allowance: float, defect: float = DEFAULT_DEFECT) -> float:
    """The bad fraction of the defect a window must catch: ``defect`` where the SLO allows less,
    else the allowance plus it (P50 allows half: a defect is 52 % over), at most 1."""
    return min(1.0, defect if defect > allowance else allowance + defect)


def power_at(
    n: int,
    allowance: float,
    false_alarm: float = DEFAULT_FALSE_ALARM,
    defect: float = DEFAULT_DEFECT,
) -> float:
    """The power of a window of ``n`` requests: ``P[X >= k | p = d]`` at its critical count
    ``k`` (:func:`critical_count`) and the defect ``d`` (:func:`defect_rate`); 0 when the window
    cannot fail.

    Raises:
        ValueError: ``n < 0``, a rate outside [0, 1].
    """
    k = critical_count(n, allowance, false_alarm)
    return binom_sf(k, n, defect_rate(allowance, defect)) if k <= n else 0.0


@lru_cache(maxsize=256)
def required_requests(
    allowance: float,
    false_alarm: float = DEFAULT_FALSE_ALARM,
    power: float = DEFAULT_POWER,
    defect: float = DEFAULT_DEFECT,
) -> int | None:
    """The fewest requests ``n`` from which a window catches the defect (:func:`defect_rate`)
    with at least ``power`` at every size from ``n`` to ``HORIZON x n``, each judged at its own
    critical count (:func:`critical_count`); None beyond :data:`MAX_REQUESTS`. With the
    defaults (5 %, 90 %, 2 %): 194 requests at 99.9 % (failing at 2 failures), 525 at a 0.5 %
    timeout rate, 1349 for a P99 against 1 % (the module docstring's "Sized to stay powered")."""
    d = defect_rate(allowance, defect)
    if d <= allowance:
        return None
    k, candidate, end = 1, None, MAX_REQUESTS
    for n in range(1, MAX_REQUESTS + 1):
        if n > end:
            break
        k_before = k
        k = _critical(n, allowance, false_alarm, start=k)  # k(n) never decreases
        if candidate is not None and k == k_before:
            continue  # at a fixed k the power only rises with n: only a step can dip
        if k <= n and binom_sf(k, n, d) >= power:
            if candidate is None:
                candidate, end = n, min(MAX_REQUESTS, HORIZON * n)
        elif candidate is not None:  # a step dipped below the target: start again after it
            candidate, end = None, MAX_REQUESTS
    return candidate


def steps(
    allowance: float,
    upto: int,
    false_alarm: float = DEFAULT_FALSE_ALARM,
    defect: float = DEFAULT_DEFECT,
) -> list[tuple[int, int, float, float]]:
    """Where the critical count steps up, for window sizes up to ``upto``: ``(n, k, power at
    n - 1, power at n)`` for each ``n`` whose ``k`` exceeds that of ``n - 1`` (the power's dips:
    the docs' table). Sizes where the window cannot fail are left out.

    Raises:
        ValueError: a rate outside [0, 1].
    """
    _check_rate("false_alarm", false_alarm)
    _check_rate("allowance", allowance)
    d = defect_rate(allowance, defect)
    out: list[tuple[int, int, float, float]] = []
    k_prev, p_prev = 0, 0.0
    k = 1
    for n in range(1, upto + 1):
        k = _critical(n, allowance, false_alarm, start=k)
        if k > n:
            continue
        p = binom_sf(k, n, d)
        if k_prev and k > k_prev:
            out.append((n, k, p_prev, p))
        k_prev, p_prev = k, p
    return out


def window_seconds(
    rate_rps: float,
    allowance: float,
    false_alarm: float = DEFAULT_FALSE_ALARM,
    power: float = DEFAULT_POWER,
    defect: float = DEFAULT_DEFECT,
) -> float:
    """Seconds of load at ``rate_rps`` that hold :func:`required_requests` (whole seconds,
    rounded up): ``warmup_s: auto`` of the background load. 25 s at 8 req/s and 99.9 %.

    Raises:
        ValueError: ``rate_rps <= 0``, or no window size reaches the power target.
    """
    if not rate_rps > 0:
        raise ValueError(f"sizing a window needs a rate above 0 req/s (got {rate_rps})")
    n = required_requests(allowance, false_alarm, power, defect)
    if n is None:
        raise ValueError(
            f"no window of up to {MAX_REQUESTS} requests catches a {defect:.3g} defect "
            f"{power:.0%} of the time at an allowance of {allowance:.3g}"
        )
    return float(math.ceil(n / rate_rps))


@dataclass(frozen=True)
class WindowTest:
    """One window judged against one SLO by the exact binomial test.

    Attributes:
        n: requests judged (for a latency SLO: the successful ones).
        bad: bad requests among them (failed, timed out, over the latency threshold).
        allowance: the bad fraction the SLO allows.
        fails_at: the critical count ``k``: the window fails at ``bad >= fails_at``
            (``n + 1``: it cannot fail).
        false_alarm: ``P[X >= fails_at | p = allowance]``, the chance a service exactly at the
            SLO fails this window. false_alarm_bound: the plan's bound on it.
        defect: the bad fraction of the defect to catch (:func:`defect_rate`).
        power: ``P[X >= fails_at | p = defect]``. power_target: the plan's target for it.
        needed: requests a window needs to reach the power target (None: over
            :data:`MAX_REQUESTS`).
        passed: ``bad < fails_at``.
    """

    n: int
    bad: int
    allowance: float
    fails_at: int
    false_alarm: float
    false_alarm_bound: float
    defect: float
    power: float
    power_target: float
    needed: int | None
    passed: bool

    @property
    def powered(self) -> bool:
        """Whether the window reaches the power target."""
        return self.power >= self.power_target

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form, with ``powered``."""
        return {**asdict(self), "powered": self.powered}

    def rule(self, bad_word: str = "bad") -> str:
        """The window's rule and false-alarm rate: ``"fails at 2 or more failed of 200 (false
        alarm 1.8 % at the SLO, bound 5 %)"``."""
        if self.fails_at > self.n:
            return (
                f"cannot fail at {self.n} requests (no count of {bad_word} keeps the false "
                f"alarm at the SLO within {self.false_alarm_bound:.0%})"
            )
        return (
            f"fails at {self.fails_at} or more {bad_word} of {self.n} (false alarm "
            f"{_pct(self.false_alarm)} at the SLO, bound {_pct(self.false_alarm_bound)})"
        )

    def power_text(self) -> str:
        """The chance of catching the defect, and what a powered window needs when this one is
        short: ``"catches a 2 % defect only 37 % of the time at n=64; 194 needed for 90 %"``."""
        head = f"catches a {_pct(self.defect)} defect"
        if self.powered:
            return f"{head} {_pct(self.power)} of the time at n={self.n}"
        need = f"{self.needed} needed" if self.needed is not None else "no window size suffices"
        return (
            f"{head} only {_pct(self.power)} of the time at n={self.n}; "
            f"{need} for {_pct(self.power_target)}"
        )

    def statement(self, bad_word: str = "bad") -> str:
        """The window's error rates in one line: :meth:`rule`; :meth:`power_text`."""
        return f"{self.bad} {bad_word} of {self.n}: {self.rule(bad_word)}; {self.power_text()}"


def _pct(x: float) -> str:
    v = 100.0 * x
    if v == 0 or v >= 10:
        return f"{v:.0f} %"
    return f"{v:.2g} %" if v >= 0.01 else f"{v:.1e} %"


def _check_rate(name: str, value: float) -> None:
    if not (isinstance(value, int | float) and 0.0 <= float(value) <= 1.0):
        raise ValueError(f"{name}={value}: a rate must be between 0 and 1")


def judge_window(
    n: int,
    bad: int,
    allowance: float,
    false_alarm: float = DEFAULT_FALSE_ALARM,
    power: float = DEFAULT_POWER,
    defect: float = DEFAULT_DEFECT,
) -> WindowTest:
    """Judge a window of ``n`` requests holding ``bad`` bad ones against an SLO allowing the
    fraction ``allowance`` (the module docstring's rule).

    Raises:
        ValueError: a negative count, ``bad > n``, a rate outside [0, 1].
    """
    if n < 0 or bad < 0 or bad > n:
        raise ValueError(f"a window needs 0 <= bad <= n (n={n}, bad={bad})")
    for name, value in (("false_alarm", false_alarm), ("power", power), ("defect", defect)):
        _check_rate(name, value)
    k = critical_count(n, allowance, false_alarm)
    d = defect_rate(allowance, defect)
    return WindowTest(
        n=n,
        bad=bad,
        allowance=float(allowance),
        fails_at=k,
        false_alarm=binom_sf(k, n, allowance),
        false_alarm_bound=float(false_alarm),
        defect=d,
        power=binom_sf(k, n, d),
        power_target=float(power),
        needed=required_requests(float(allowance), float(false_alarm), float(power), float(defect)),
        passed=bad < k,
    )


def plan_settings(configuration: Any) -> dict[str, float]:
    """The plan's test settings from the configuration (plan ``vars`` / ``--var``):
    ``{"false_alarm", "power", "defect"}`` from ``window_false_alarm``, ``window_power`` and
    ``window_defect`` (defaults 0.05, 0.9, 0.02; an unset ``${...}`` reads as the default).

    Raises:
        ValueError: a value that is not a number strictly between 0 and 1 (one line).
    """
    conf = configuration if isinstance(configuration, dict) else {}
    out: dict[str, float] = {}
    for key, default in SETTING_KEYS.items():
        raw = conf.get(key)
        if raw in (None, "") or str(raw).startswith("${"):
            value = default
        else:
            try:
                value = float(raw)
            except (TypeError, ValueError):
                raise ValueError(f"{key}={raw!r}: not a number") from None
            if not 0.0 < value < 1.0:
                raise ValueError(f"{key}={raw}: must be strictly between 0 and 1")
        out[key.removeprefix("window_")] = value
    return out
