"""Open-loop arrival schedules.

A schedule is a precomputed, sorted list of **absolute offsets in seconds** from the start of a run.
The load client sends request *i* at ``start + schedule[i]`` no matter how earlier requests fared
(open loop), so queueing inside the client shows up as ``sent_at - intended_at`` instead of being
hidden (coordinated omission, see ``docs/definitions.md``, "Send time").
"""

from __future__ import annotations

import math
import random

__all__ = [
    "Profile",
    "check_profile",
    "constant_schedule",
    "parse_profile",
    "poisson_schedule",
    "profile_phases",
    "profile_schedule",
    "truncate_profile",
]


def _check(rate_rps: float, duration_s: float) -> None:
    if not (isinstance(rate_rps, int | float) and math.isfinite(rate_rps) and rate_rps > 0):
        raise ValueError(f"rate_rps must be a finite number > 0, got {rate_rps!r}")
    if not (isinstance(duration_s, int | float) and math.isfinite(duration_s) and duration_s >= 0):
        raise ValueError(f"duration_s must be a finite number >= 0, got {duration_s!r}")


def poisson_schedule(rate_rps: float, duration_s: float, seed: int | None = 0) -> list[float]:
    """Arrival offsets of a Poisson process (exponential inter-arrival gaps).

    Args:
        rate_rps: mean arrival rate in requests per second (> 0).
        duration_s: length of the schedule in seconds (>= 0); every offset is < ``duration_s``.
        seed: seed of a private ``random.Random``; the same seed gives the same schedule.

    Returns:
        Sorted offsets in seconds from the start of the run. The expected length is
        ``rate_rps * duration_s``; the first arrival is after one exponential gap, not at 0.

    Raises:
        ValueError: rate or duration not a finite positive number.
    """
    _check(rate_rps, duration_s)
    return _poisson(random.Random(seed), rate_rps, duration_s)


def _poisson(rng: random.Random, rate_rps: float, duration_s: float) -> list[float]:
    out: list[float] = []
    t = rng.expovariate(rate_rps)
    while t < duration_s:
        out.append(t)
        t += rng.expovariate(rate_rps)
    return out


def constant_schedule(rate_rps: float, duration_s: float) -> list[float]:
    """Evenly spaced arrivals ``0, 1/rate, 2/rate, ...`` strictly below ``duration_s``.

    Args:
        rate_rps: arrivals per second (> 0).
        duration_s: length of the schedule in seconds (>= 0).

    Returns:
        Offsets in seconds from the start of the run (``ceil(rate_rps * duration_s)`` of them).

    Raises:
        ValueError: rate or duration not a finite positive number.
    """
    _check(rate_rps, duration_s)
    gap = 1.0 / rate_rps
    n = math.ceil(duration_s * rate_rps - 1e-9)
    return [i * gap for i in range(n) if i * gap < duration_s]


#: A rate profile: consecutive ``(duration_s, rate_rps)`` phases.
Profile = list[tuple[float, float]]


def check_profile(profile: object) -> Profile:
    """Validate a rate profile and return it as a list of ``(duration_s, rate_rps)`` float tuples.

    Args:
        profile: a non-empty sequence of 2-item sequences ``(duration_s > 0, rate_rps > 0)``
            (lists from YAML/JSON are accepted).

    Returns:
        The normalised profile.

    Raises:
        ValueError: empty profile, a phase that is not a pair, or a non-finite / non-positive
            duration or rate (one-line message naming the phase, 1-based).
    """
    if isinstance(profile, str | bytes) or not isinstance(profile, list | tuple) or not profile:
        raise ValueError(
            f"profile must be a non-empty list of (duration_s, rate_rps), got {profile!r}"
        )
    out: Profile = []
    for i, phase in enumerate(profile, 1):
        if isinstance(phase, str | bytes) or not isinstance(phase, list | tuple) or len(phase) != 2:
            raise ValueError(f"profile phase {i} must be (duration_s, rate_rps), got {phase!r}")
        d, r = phase
        for name, v in (("duration_s", d), ("rate_rps", r)):
            ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
            if not ok or v <= 0:
                raise ValueError(
                    f"profile phase {i}: {name} must be a finite number > 0, got {v!r}"
                )
        out.append((float(d), float(r)))
    return out


def parse_profile(text: str) -> Profile:
    """Parse ``"10:8,15:24,15:8"`` (comma-separated ``duration_s:rate_rps`` pairs) into a profile.

    Raises:
        ValueError: malformed text or an invalid phase (see ``check_profile``).
    """
    phases: list[tuple[float, float]] = []
    for i, part in enumerate(text.split(","), 1):
        bits = part.strip().split(":")
        if len(bits) != 2:
            raise ValueError(f"profile phase {i} must be duration_s:rate_rps, got {part.strip()!r}")
        try:
            phases.append((float(bits[0]), float(bits[1])))
        except ValueError:
            raise ValueError(f"profile phase {i} is not two numbers: {part.strip()!r}") from None
    return check_profile(phases)


def truncate_profile(profile: Profile, max_s: float) -> Profile:
    """The profile cut at ``max_s`` seconds (phases after it dropped, the last one shortened).

    Raises:
        ValueError: invalid profile, or ``max_s`` not a finite number > 0.
    """
    prof = check_profile(profile)
    if not (isinstance(max_s, int | float) and math.isfinite(max_s) and max_s > 0):
        raise ValueError(f"max_s must be a finite number > 0, got {max_s!r}")
    out: Profile = []
    t = 0.0
    for d, r in prof:
        if t >= max_s:
            break
        out.append((min(d, max_s - t), r))
        t += d
    return out


def profile_phases(profile: Profile) -> list[dict[str, float]]:
    """Phase boundaries of a profile: ``[{"index", "start_s", "end_s", "duration_s", "rate_rps"}]``
    (offsets in seconds from the start of the run; ``index`` 0-based).

    Raises:
        ValueError: invalid profile.
    """
    out: list[dict[str, float]] = []
    t = 0.0
    for i, (d, r) in enumerate(check_profile(profile)):
        out.append({"index": i, "start_s": t, "end_s": t + d, "duration_s": d, "rate_rps": r})
        t += d
    return out


def profile_schedule(
    profile: Profile, seed: int | None = 0, arrival: str = "poisson"
) -> list[float]:
    """Arrival offsets of a piecewise-constant rate profile.

    The absolute schedule is the concatenation of one schedule per phase: phase *k* (starting at
    the sum of the earlier durations) gets a Poisson schedule of its rate over its duration
    (``arrival="constant"``: evenly spaced arrivals instead), shifted by its start. One private
    ``random.Random(seed)`` draws every phase in order, so the same seed and profile give the same
    schedule.

    Args:
        profile: consecutive ``(duration_s, rate_rps)`` phases (see ``check_profile``).
        seed: RNG seed (None: random).
        arrival: ``"poisson"`` or ``"constant"``.

    Returns:
        Sorted offsets in seconds from the start of the run, all < the profile's total duration.

    Raises:
        ValueError: invalid profile or arrival.
    """
    if arrival not in ("poisson", "constant"):
        raise ValueError(f"arrival must be 'poisson' or 'constant', got {arrival!r}")
    rng = random.Random(seed)
    out: list[float] = []
    t0 = 0.0
    for d, r in check_profile(profile):
        phase = _poisson(rng, r, d) if arrival == "poisson" else constant_schedule(r, d)
        out.extend(t0 + o for o in phase)
        t0 += d
    return out
