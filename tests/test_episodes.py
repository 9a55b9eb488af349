"""Every episode out of SLO counts (issue 29 item 3): a second collapse after a brief return is
judged like the first, in every drill that judges the interruption.

Synthetic records (unix seconds, ``tests/verdictkit.py``) through the real judge under the
default policy; the drills' interruption figures computed as their rooms compute them
(:func:`chaoslib_infer.drills.interruption.interruption_figures` over
:func:`chaoslib_infer.measure.figures.interruption`; network-jitter's over the logical requests'
final outcomes, ``interruption_seen``).
"""

from __future__ import annotations

from typing import Any

import pytest
from verdictkit import JITTER_GROUND, T0, rec

from chaoslib_infer.drills.interruption import interruption_figures
from chaoslib_infer.drills.network_jitter.figures import interruption_seen
from chaoslib_infer.measure.episodes import episodes
from chaoslib_infer.measure.figures import interruption
from chaoslib_infer.verdict import DrillFacts, judge_drill
from chaoslib_infer.verdict.blame import strip_blame

FAULT_AT = T0 + 10
RATE = 8.0  # requests/s

#: each drill: (ground truth, its own figures but the interruption, faulted replicas)
DRILLS: dict[str, tuple[dict[str, Any], dict[str, Any], tuple[str, ...]]] = {
    "node-loss": (
        {
            "fault_at": FAULT_AT,
            "node": "n0",
            "lost_replica_names": ["r0"],
            "replicas_killed_at": FAULT_AT,
            "replica_serving_again_at": T0 + 14,
        },
        {"replacement_serving_s": 4.0},
        ("r0",),
    ),
    "oom-kill": (
        {
            "fault_at": FAULT_AT,
            "replica": "r0",
            "oom_kills": 1,
            "death_cause": "oom",
            "replica_serving_again_at": T0 + 12,
        },
        {"restart_s": 2.0, "warmup_ratio": 3.0},
        ("r0",),
    ),
    "simultaneous-restarts": (
        {
            "fault_at": FAULT_AT,
            "replicas": ["r0", "r1"],
            "survivors": ["r2"],
            "all_serving_at": T0 + 13,
        },
        {"all_serving_s": 3.0},
        ("r0", "r1"),
    ),
    "network-jitter": (
        JITTER_GROUND,
        {"duplicate_generations": 0, "extra_generations": 0, "retries": 0},
        (),
    ),
}


def run(
    faulted: tuple[str, ...], collapse: tuple[float, float] | None, end: float = 80.0
) -> list[dict[str, Any]]:
    """8 requests/s from T0 to T0 + ``end`` over r0..r2 in turn; the faulted replicas' requests
    from the injection go to the others (the gateway moved them) until the collapse is over;
    one stream on r0 sent at +9.9 s is cut at the injection; every request sent in
    ``collapse`` (s after T0) fails with a 503."""
    reps = ("r0", "r1", "r2")
    spared = [r for r in reps if r not in faulted]
    back = collapse[1] if collapse else 30.0
    out = []
    for i in range(int(end * RATE)):
        t = i / RATE
        rep = reps[i % 3]
        if 10 <= t < back and rep in faulted:
            rep = spared[i % len(spared)]
        if collapse and collapse[0] <= t < collapse[1]:
            out.append(rec(T0 + t, ok=False, replica=None))
        elif abs(t - 9.875) < 1e-9:  # on the wire at the injection: cut
            out.append(rec(T0 + t, ok=False, e2e=0.2, replica=None, error_class="reset"))
        else:
            out.append(rec(T0 + t, replica=rep))
    return out


def judge(drill: str, records: list[dict[str, Any]]) -> Any:
    ground, own, _ = DRILLS[drill]
    figures = dict(own)
    if drill == "network-jitter":  # over the users' final outcomes (its room's figures.py)
        figures.update(interruption_seen(records, FAULT_AT))
    else:  # the rooms' own computation (drills/*/figures.py)
        figures.update(interruption_figures(interruption(records, FAULT_AT)))
    return judge_drill(DrillFacts(drill, records, figures, dict(ground)))


def rows(v: Any) -> dict[str, dict[str, Any]]:
    return {r["criterion"]: r for r in v.rows}


def test_episodes_by_hand() -> None:
    records = run(("r0",), (16.0, 41.0))
    eps = episodes(records, FAULT_AT)
    # the cut stream ends at +0.075 s: an episode of 0 s, closed by 6 s of service; the collapse
    # from the first 503 seen (sent at 16.0, answered 0.3 s later) to the last (40.875 + 0.3)
    assert [(round(e.start - FAULT_AT, 3), round(e.end - FAULT_AT, 3)) for e in eps.items] == [
        (0.075, 0.075),
        (6.3, 31.175),
    ]
    assert [e.failed for e in eps.items] == [1, 200]
    assert eps.total_s == pytest.approx(24.875) and eps.sustained
    assert eps.longest is eps.items[1]
    # the load ends inside the collapse: the last episode was never seen to close
    cut_short = episodes(run(("r0",), (16.0, 41.0), end=30.0), FAULT_AT)
    assert len(cut_short.items) == 2 and not cut_short.sustained
    # the figure every drill reports: the time out of SLO of every episode, and the episodes
    got = interruption(records, FAULT_AT)
    assert got["interruption_s"] == pytest.approx(24.875)
    assert (got["episodes"], got["failed_requests"]) == (2, 201)
    assert got["longest_episode_s"] == pytest.approx(24.875)


@pytest.mark.parametrize("drill", sorted(DRILLS))
def test_a_second_collapse_after_a_brief_return_fails_the_drill(drill: str) -> None:
    """One stream cut at the injection, the survivors serve 6 s, then every request fails for
    25 s (200 lost): FAILED on the interruption, the reason naming both episodes; the budget
    alone (25 s, 1 % of the month's) would have passed it."""
    faulted = DRILLS[drill][2]
    v = judge(drill, run(faulted, (16.0, 41.0)))
    assert v.state == "failed", v.reasons
    want = (
        "interruption (time out of SLO): 2 episodes (+0.1 s, +6.3 to +31.2 s after the "
        "injection), longest 24.9 s: 24.9 s > 10 s (interruption_s)"
    )
    assert want in [strip_blame(r) for r in v.reasons], v.reasons
    got = rows(v)
    assert got["budget_share"]["result"] == "pass"  # the cost alone would not have caught it
    assert got["budget_cost_s"]["value"] == pytest.approx(25.0, abs=0.2)


@pytest.mark.parametrize("drill", sorted(DRILLS))
def test_a_fault_costing_a_few_requests_mitigated_in_seconds_passes(drill: str) -> None:
    """The well-run side: one stream cut at the injection and 1.5 s of 503s, then served (the
    faulted replicas' share carried by the others): PASSED, one episode or two, short."""
    faulted = DRILLS[drill][2]
    v = judge(drill, run(faulted, (10.0, 11.5)))
    assert v.state == "passed", v.reasons
    got = rows(v)
    assert got["interruption_s"]["result"] == "pass"
    assert got["interruption_s"]["value"] == pytest.approx(1.6)  # +0.075 to +1.675 s
    assert got["interruption_s"]["label"].startswith("interruption (time out of SLO): 1 episode")
    assert got["budget_share"]["result"] == "pass"
    assert got["fast_burn_page"]["value"] == 0.0


def test_network_jitter_counts_the_failures_its_users_saw_not_the_attempts_retried() -> None:
    """A third of the first attempts time out for 20 s of jitter and are answered by a retry:
    no user saw a failure, no episode (over the attempts it would read 20 s out of SLO); the
    same requests failing at the end of their retries are an episode."""
    records = []
    for r in run((), None):
        late = FAULT_AT <= r["sent_at"] < FAULT_AT + 20 and r["replica"] == "r0"
        if not late:
            records.append(r)
            continue
        first = rec(r["sent_at"], ok=False, e2e=1.0, replica=None, error_class="timeout")
        retry = rec(r["sent_at"] + 1.0, replica="r1", rid=first["request_id"], attempt=2)
        records += [{**first, "final": False}, retry]
    over_attempts = interruption(records, FAULT_AT)["interruption_s"]
    assert over_attempts == pytest.approx(20.55)  # from the stream cut at +0.075 s
    v = judge("network-jitter", records)
    got = rows(v)
    assert (got["interruption_s"]["value"], got["interruption_s"]["result"]) == (0.0, "pass")
    # the retries failed too: the users saw every one of those requests fail, 20 s out of SLO
    gave_up = [
        {**r, "ok": False, "error_class": "timeout"} if r["attempt"] == 2 else r for r in records
    ]
    v = judge("network-jitter", gave_up)
    assert rows(v)["interruption_s"]["result"] == "fail" and v.state == "failed"
