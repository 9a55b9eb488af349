"""A fault confirmed by the traffic (issue 21 item 3, ``chaoslib_infer/verdict/confirm.py``): on
synthetic records, each rule reached and missed, the reason text, and the verdict it makes."""

from __future__ import annotations

from typing import Any

import pytest
from verdictkit import T0, rec, steady

from chaoslib_infer.verdict import DrillFacts, judge_drill
from chaoslib_infer.verdict.confirm import (
    MISSED,
    confirm_by_traffic,
    faulted_names,
    quota_reach,
    traffic_reach,
)
from chaoslib_infer.verdict.timeline import Timeline, timeline

AT = T0 + 10.0  # injection
END = T0 + 20.0  # return to service


def cut(sent: float, replica: str | None, ok: bool = True, e2e: float = 0.3) -> dict[str, Any]:
    """One attempt answered by ``replica`` (None: no X-Replica-Id); a failure is a reset."""
    return rec(sent, ok, e2e, replica, error_class="reset")


def load(
    a: float, b: float, reps: tuple[str | None, ...] = ("r0", "r1", "r2"), **kw: Any
) -> list[dict[str, Any]]:
    """10 requests a second, round robin over ``reps``."""
    return steady(a, b, replicas=reps, error_class="reset", **kw)


def test_a_replica_that_never_served_the_traffic_missed_it() -> None:
    """The URL routes to r1 and r2 only: a fault on r0 did not reach the traffic."""
    records = load(T0, T0 + 30, ("r1", "r2"))
    reach = traffic_reach(records, ["r0"], AT, END)
    assert reach.felt is False
    assert reach.why == (
        f"{MISSED}: r0 served none of the 100 requests answered before it (served by: r1 50, r2 50)"
    )


def test_moved_traffic_confirms_the_fault() -> None:
    records = load(T0, AT) + load(AT, END, ("r1", "r2")) + load(END, T0 + 30)
    reach = traffic_reach(records, ["r0"], AT, END)
    assert reach.felt is True
    assert "moved (share of answers 34% -> 0%)" in reach.why
    assert "r0 served 34 of 100 requests before it and 0 of 100 during it" in reach.why


def test_failed_requests_of_the_faulted_replica_confirm_it_nameless_ones_do_not() -> None:
    during = [
        cut(AT + i / 10, "r0" if i % 3 == 0 else ("r1", "r2")[i % 2], ok=i % 3 != 0)
        for i in range(100)
    ]
    reach = traffic_reach(load(T0, AT) + during, ["r0"], AT, END)
    assert reach.felt is True and "34 of its requests failed" in reach.why
    # the same failures naming no replica (issue 30): they may have failed anywhere, so they
    # are not the faulted replica's; the lab's logs (replica_of) name them when they can
    nameless = [{**r, "replica": None} if not r["ok"] else r for r in during]
    tail = load(END, T0 + 30)
    reach = traffic_reach(load(T0, AT) + nameless + tail, ["r0"], AT, END)
    assert "of its requests failed" not in reach.why
    who = {r["request_id"]: "r0" for r in nameless if not r["ok"]}
    reach = traffic_reach(load(T0, AT) + nameless + tail, ["r0"], AT, END, replica_of=who)
    assert reach.felt is True and "34 of its requests failed" in reach.why
    # another replica's failures, named by the logs, are not r0's
    who = {rid: "r1" for rid in who}
    reach = traffic_reach(load(T0, AT) + nameless + tail, ["r0"], AT, END, replica_of=who)
    assert "of its requests failed" not in reach.why


def test_a_failure_on_another_replica_does_not_confirm_a_fault_on_r0() -> None:
    during = [cut(AT + i / 10, ("r0", "r1", "r2")[i % 3], ok=i % 3 != 1) for i in range(100)]
    reach = traffic_reach(load(T0, AT) + during + load(END, T0 + 30), ["r0"], AT, END)
    assert reach.felt is False
    assert reach.why.startswith(f"{MISSED}: r0 served 34 of 100 requests before it")
    assert "none failed, moved or paused, median E2E 0.3 s -> 0.3 s" in reach.why


def test_slowed_requests_confirm_the_fault_a_small_change_does_not() -> None:
    def run(extra: float) -> Any:
        during = [
            cut(AT + i / 10, ("r0", "r1", "r2")[i % 3], e2e=0.3 + (extra if i % 3 == 0 else 0))
            for i in range(100)
        ]
        return traffic_reach(load(T0, AT) + during, ["r0"], AT, END)

    slow = run(0.4)
    assert slow.felt is True and "slowed (median E2E 0.3 s -> 0.7 s)" in slow.why
    assert run(0.03).felt is False  # under SLOWED_MIN_S above the median before


def test_a_pause_in_the_faulted_replicas_answers_confirms_it() -> None:
    """Every replica restarted (nothing to move to): a 4 s gap in their answers."""
    records = load(T0, AT) + load(AT + 4, END) + load(END, T0 + 30)
    reach = traffic_reach(records, ["r0", "r1", "r2"], AT, END)
    assert (
        reach.felt is True and "paused (4.1 s without an answer, 0.3 s at most before)" in reach.why
    )


def test_records_without_engine_identity_confirm_only_by_failures_or_slowdown() -> None:
    quiet = load(T0, T0 + 30, (None,))
    reach = traffic_reach(quiet, ["r0"], AT, END)
    assert reach.felt is False
    assert reach.why == (
        f"{MISSED}: no request failed or slowed in the fault window; the records name no engine "
        "(no X-Replica-Id), so a move off r0 cannot be seen"
    )
    hurt = load(T0, AT, (None,)) + [cut(AT + 1, None, ok=False)] + load(AT + 2, T0 + 30, (None,))
    assert traffic_reach(hurt, ["r0"], AT, END).felt is True


def test_nothing_to_trace_without_a_faulted_replica() -> None:
    assert traffic_reach(load(T0, T0 + 30), [], AT, END).felt is None
    assert traffic_reach(load(T0, T0 + 30), ["r0"], None, None).felt is None


def test_faulted_names_of_the_lab_and_of_kubernetes() -> None:
    assert faulted_names("node-loss", {"replica": None, "lost_replica_names": ["r0", "r1"]}) == [
        "r0",
        "r1",
    ]
    assert faulted_names("quota-cut", {"replica": "x", "stopped": ["r2"]}) == ["r2"]
    assert faulted_names("traffic-spike", {"replica": "r0"}) == []
    k8s = {
        "k8s_oom_pod": "vllm-0 (container vllm)",
        "k8s_recovery_pod vllm-1": {"total_recovery_s": 1.0},
        "k8s_ingress_block_pod": "vllm-2",
    }
    assert faulted_names("oom-kill", k8s) == ["vllm-0", "vllm-2", "vllm-1"]


def test_quota_cut_on_a_cluster_by_the_engines_that_served() -> None:
    pods = ("vllm-a", "vllm-b", "vllm-c")
    cut = load(T0, AT, pods) + load(AT, END, pods[:2])
    felt = quota_reach(cut, AT, END)
    assert felt.felt is True
    assert felt.why == (
        "the traffic felt it: 3 engines served before the cut (vllm-a 34, vllm-b 33, vllm-c 33), "
        "2 during it (vllm-a 50, vllm-b 50)"
    )
    missed = quota_reach(load(T0, END, ("sim",)), AT, END)
    assert missed.felt is False
    assert missed.why == (
        f"{MISSED}: 1 engines served before the cut (sim 100), 1 during it (sim 100)"
    )


def test_network_jitter_is_confirmed_by_the_delay_the_shim_applied() -> None:
    ground = {
        "fault_at": AT,
        "cleared_at": END,
        "mechanism": "shim",
        "replica": "r0",
        "delay_ms": 150,
        "jitter_ms": 40,
        "generations_on_replica_in_window": 30,  # a generation is not a delay: ignored
        "shim": {"connections": 4, "applied_delay": {"n": 0, "mean_s": None}},
    }
    tl = timeline("network-jitter", ground, {})
    assert tl.confirmed is False
    assert (
        tl.why
        == "150 ms +- 40 ms on r0 (shim): the shim applied no delay (0 chunks over 4 connections)"
    )
    ground["shim"] = {"connections": 4, "applied_delay": {"n": 120, "mean_s": 0.151}}
    tl = timeline("network-jitter", ground, {})
    assert tl.confirmed is True and "the shim delayed 120 chunks by 151 ms on average" in tl.why
    # the delayed chunks are on r0's link: r0 serving before and the drill's requests on it
    # during the fault are enough ...
    ok = confirm_by_traffic(tl, "network-jitter", ground, load(T0, T0 + 30))
    assert ok.confirmed is True and "r0 served 34 of 100 requests before it" in ok.why
    assert "and 33 of the drill's requests during it" in ok.why
    # ... but the shim also delays the gateway's health checks: with none of the drill's
    # requests on r0 during the fault (the gateway moved them off), the shim's count is not
    # the drill's traffic (issue 30)
    moved = load(T0, AT) + load(AT, T0 + 30, ("r1", "r2"))
    health_only = confirm_by_traffic(tl, "network-jitter", ground, moved)
    assert health_only.confirmed is False
    assert "none of the drill's requests sent during it" in health_only.why
    # ... and a replica the traffic never reached is still a miss
    missed = confirm_by_traffic(tl, "network-jitter", ground, load(T0, T0 + 30, ("r1", "r2")))
    assert missed.confirmed is False and missed.why.startswith(MISSED)
    # netem: its counters, when captured; else nothing (the traffic decides)
    netem = {**ground, "mechanism": "netem", "shim": None}
    assert timeline("network-jitter", netem, {}).confirmed is None
    assert timeline("network-jitter", {**netem, "netem": {"packets": 9}}, {}).confirmed is True


def test_simultaneous_restarts_by_the_exits_observed_not_assumed() -> None:
    ground: dict[str, Any] = {"fault_at": AT, "replicas": ["r0", "r1"], "all_serving_at": END}
    assert timeline("simultaneous-restarts", ground, {}).confirmed is None  # nothing observed
    ground["restarts"] = {"r0": {"died_at": AT + 0.1}, "r1": {"died_at": None}}
    tl = timeline("simultaneous-restarts", ground, {})
    assert tl.confirmed is False and tl.why == "of r0, r1 only r0 died"
    ground["restarts"]["r1"] = {"died_at": AT + 0.2}
    assert timeline("simultaneous-restarts", ground, {}).confirmed is True


def test_the_ingress_block_variant_has_its_confirmation_branch() -> None:
    ground = {
        "k8s_ingress_block_fault_at": AT,
        "k8s_ingress_block_pod": "vllm-0",
        "k8s_ingress_block_policy": "chaos-block-1",
        "k8s_ingress_block_created_at": AT + 0.1,
    }
    figures = {"k8s_ingress_block_policy_after_s": 0.1}
    tl = timeline("upstream-timeout", ground, figures)
    assert (
        tl.confirmed is True
        and tl.why == "NetworkPolicy chaos-block-1 isolates pod vllm-0 (the API's record)"
    )
    # a CNI that does not enforce NetworkPolicy: vllm-0 keeps serving as before
    pods = ("vllm-0", "vllm-1", "vllm-2")
    missed = confirm_by_traffic(tl, "upstream-timeout", ground, load(T0, T0 + 30, pods))
    assert missed.confirmed is False
    assert missed.why.startswith(f"{MISSED}: vllm-0 served 34 of 100 requests before it")
    assert missed.why.endswith("is the NetworkPolicy enforced by the cluster's CNI?)")
    moved = load(T0, AT, pods) + load(AT, T0 + 30, pods[1:])
    assert confirm_by_traffic(tl, "upstream-timeout", ground, moved).confirmed is True


@pytest.mark.parametrize("routed", [True, False])
def test_the_verdict_of_a_kubernetes_fault_that_missed_or_reached_the_traffic(routed: bool) -> None:
    """oom-kill on a cluster: INCONCLUSIVE with the reason when the URL routes elsewhere, judged
    as before (passed) when the killed pod's traffic moved."""
    ground = {"k8s_oom_fault_at": AT, "k8s_oom_pod": "vllm-0 (container vllm)"}
    figures = {
        "k8s_oom_reason": "OOMKilled",
        "k8s_oom_restart_s": 1.0,
        "k8s_recovery_total_s_max": 5.0,
    }
    pods = ("vllm-0", "vllm-1", "vllm-2")
    if routed:
        records = load(T0, AT, pods) + load(AT, AT + 5, pods[1:]) + load(AT + 5, T0 + 30, pods)
    else:
        records = load(T0, T0 + 30, ("sim",))
    v = judge_drill(DrillFacts("oom-kill", records, figures, ground))
    if routed:
        assert v.state == "passed", v.reasons
        assert "moved (share of answers 34% -> 0%)" in v.notes[0]
    else:
        assert v.state == "inconclusive"
        assert v.reasons == [
            f"{MISSED}: vllm-0 served none of the 100 requests answered before it (served by: "
            "sim 100) (container termination reason OOMKilled)"
        ]


def test_a_lab_fault_already_unconfirmed_keeps_its_ground_truth_reason() -> None:
    tl = Timeline(AT, END, False, "no kernel OOM kill recorded")
    out = confirm_by_traffic(tl, "oom-kill", {"replica": "r0"}, load(T0, T0 + 30, ("r1",)))
    assert out is tl


def test_quota_cut_on_a_cluster_holds_by_the_pods_that_served_and_their_load() -> None:
    """The key row counts the pods that answered during the cut (not the ready endpoints), with
    the load each carried; without any pod named, the fewest ready endpoints stand in."""
    pods = ("vllm-a", "vllm-b", "vllm-c")
    ground = {"k8s_quota_fault_at": AT}
    figures = {
        "k8s_quota_replicas_before": 3,
        "k8s_quota_replicas_after": 2,
        "k8s_ready_endpoints_min": 3,  # the ready endpoints say 3: the pods' answers say 2
        "k8s_recovery_total_s_max": 10.0,
    }
    records = load(T0, AT, pods) + load(AT, T0 + 30, pods[:2])
    v = judge_drill(DrillFacts("quota-cut", records, figures, ground))
    row = {r["criterion"]: r for r in v.rows}["instances_held"]
    assert (row["value"], row["result"]) == (1.0, "pass"), row
    assert row["note"].startswith(
        "2 of the quota's 2 replicas served within the SLO during the cut (records)"
    )
    assert "load carried: vllm-a " in row["note"] and ", vllm-b " in row["note"]
    assert v.state == "passed", v.reasons
    anonymous = load(T0, T0 + 30, (None,))
    v = judge_drill(DrillFacts("quota-cut", anonymous, figures, ground))
    row = {r["criterion"]: r for r in v.rows}["instances_held"]
    assert row["value"] == 1.5 and "fewest ready endpoints: no record names its pod" in row["note"]
    assert v.state == "inconclusive" and v.reasons[0].startswith(MISSED), v.reasons


def test_netem_counters_read_from_tc_statistics() -> None:
    """``tc -s qdisc show`` as iproute2 prints it: the netem qdisc's Sent line is its count;
    another qdisc's is not, and no netem qdisc reads None (nothing to confirm from)."""
    from chaoslib_infer.drills.network_jitter.plumbing import parse_netem_counters

    out = (
        "qdisc netem 8001: root refcnt 2 limit 1000 delay 150ms  40ms\n"
        " Sent 123456 bytes 789 pkt (dropped 0, overlimits 0 requeues 0)\n"
        " backlog 0b 0p requeues 0\n"
        "qdisc fq_codel 0: parent :1 limit 10240p flows 1024\n"
        " Sent 999 bytes 9 pkt (dropped 0, overlimits 0 requeues 0)\n"
    )
    assert parse_netem_counters(out) == {"bytes": 123456, "packets": 789}
    assert parse_netem_counters("qdisc noqueue 0: root refcnt 2\n Sent 0 bytes 0 pkt\n") is None


def test_an_engine_fault_confirmed_by_its_ledger_needs_no_replica_share() -> None:
    """Armed before the load, the sabotaged requests are the drill's own (the engine's ledger):
    the traffic felt it by construction, whatever the replicas served before."""
    tl = Timeline(AT, None, True, "12 of the drill's requests sabotaged by crash (engine ledger)")
    ground = {"replicas": ["r0"], "sabotaged_request_ids": ["q1"]}
    assert confirm_by_traffic(tl, "oom-kill", ground, load(T0, T0 + 30, ("r1",))) is tl
