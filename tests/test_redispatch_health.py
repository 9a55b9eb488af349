"""Health disagreement through a gateway's redispatch (issue 30): requests hung on a replica
whose health endpoint said healthy, re-sent by HAProxy (``retry-on 503``) to a survivor when the
hang cleared, after their clients left. The hung attempts stay the hung replica's (its first
replica, not its last), and the generations made for the clients that had left are counted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from chaoslib_infer.evidence.kinds import engine_fault
from chaoslib_infer.measure.figkit import DrillContext
from chaoslib_infer.measure.health import (
    attempt_replica,
    header_replicas,
    health_disagreement,
    replica_of_requests,
)
from chaoslib_infer.measure.rerun import generations_after_client_left, rerun_figures

T0 = 1_800_000_000.0


def _hung_and_redispatched() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """r0 hangs from T0: 12 requests sent to it over 11 s get no header; their clients give up
    after 3 s (timeout_ttft); the hang clears at T0 + 14 and HAProxy re-sends all 12 to r1,
    which generates them for nobody. r1 answers its own traffic meanwhile."""
    records: list[dict[str, Any]] = []
    ledger: list[dict[str, Any]] = []
    for k in range(12):
        t, rid = T0 + k, f"h{k}"
        records.append(
            {
                "request_id": rid,
                "attempt": 1,
                "sent_at": t,
                "end_at": t + 3.0,
                "ok": False,
                "error_class": "timeout_ttft",
                "replica": None,
            }
        )
        ledger.append(
            {"t": t, "event": "fault", "mode": "hang", "replica": "r0", "request_id": rid}
        )
        ledger.append(
            {"t": T0 + 14.0 + k * 0.01, "event": "generation", "replica": "r1", "request_id": rid}
        )
    for k in range(30):
        t = T0 + k * 0.5
        records.append(
            {"request_id": f"s{k}", "attempt": 1, "sent_at": t, "end_at": t + 0.2, "ok": True}
            | {"replica": "r1"}
        )
        ledger.append({"t": t, "event": "generation", "replica": "r1", "request_id": f"s{k}"})
    return records, ledger


def _samples(replica: str) -> list[dict[str, Any]]:
    return [{"t": T0 + i * 0.25, "replica": replica, "healthy": True} for i in range(61)]


def test_a_redispatched_hung_request_stays_its_first_replicas() -> None:
    records, ledger = _hung_and_redispatched()
    # HAProxy's log names the server that answered last: the survivor
    routed = [(f"h{k}", "r1") for k in range(12)]
    mapping = replica_of_requests(ledger, routed)
    assert {mapping[f"h{k}"] for k in range(12)} == {"r0"}
    res = health_disagreement(_samples("r0"), records, replica_of=mapping)
    # r0 said healthy from T0 to T0 + 15 while each of its windows' attempts failed: at least
    # the 14 s from the first send to the last give-up
    assert res["disagreement_s"] >= 13.0
    assert res["by_replica"]["r0"] == res["disagreement_s"]
    # the last ledger line (or HAProxy's last server) would hand them to r1, whose own traffic
    # succeeded: the disagreement lost (the bug)
    last = {e["request_id"]: e["replica"] for e in ledger}
    assert health_disagreement(_samples("r0"), records, replica_of=last)["disagreement_s"] == 0
    # the routed log only fills requests the ledger does not name
    assert replica_of_requests([], routed)["h0"] == "r1"
    # the 12 generations made for clients that had left are counted
    assert generations_after_client_left(records, ledger) == 12
    assert rerun_figures(records, ledger, [])["generations_after_client_left"] == 12
    assert generations_after_client_left(records, []) is None  # no ledger: unmeasured


def test_the_engine_fault_row_recomputed_from_its_checks_keeps_the_disagreement(
    tmp_path: Path,
) -> None:
    records, ledger = _hung_and_redispatched()
    check = {
        "replica": "r0",
        "started_at": T0,
        "ended_at": T0 + 15,
        "window_s": 1.0,
        "min_failed_ratio": 1.0,
    }
    (tmp_path / "health_checks.jsonl").write_text(json.dumps(check) + "\n")
    (tmp_path / "health_samples.jsonl").write_text(
        "".join(json.dumps(s) + "\n" for s in _samples("r0"))
    )
    faults = [{"kind": "engine-fault", "replica": "r0", "mode": "hang", "fault_at": T0}]
    ctx = DrillContext(tmp_path, records, faults, [], ledger)
    figures, _ = engine_fault.compute(ctx)
    assert figures["health_disagreement_s"] == pytest.approx(15.0)
    assert figures["sabotaged_requests"] == 12


def test_a_header_less_attempt_is_not_given_its_own_retrys_replica() -> None:
    """A frozen engine writes no ledger line while frozen: the first line of a request it held
    is the client's retry on a survivor, whose own record names that survivor. The held
    attempt is then of no known replica, never the survivor's (its failure would count against
    a replica that answered)."""
    held = {
        "request_id": "f",
        "attempt": 1,
        "sent_at": T0,
        "end_at": T0 + 3,
        "ok": False,
        "error_class": "timeout_ttft",
        "replica": None,
    }
    retry = {"request_id": "f", "attempt": 2, "sent_at": T0 + 3.1, "end_at": T0 + 3.5}
    retry |= {"ok": True, "replica": "r1"}
    mapping = replica_of_requests(
        [{"t": T0 + 3.1, "event": "generation", "replica": "r1", "request_id": "f"}]
    )
    assert mapping == {"f": "r1"}
    named = header_replicas([held, retry])
    assert attempt_replica(held, mapping, named) is None
    assert attempt_replica(retry, mapping, named) == "r1"
    assert attempt_replica(held, {"f": "r0"}, named) == "r0"  # the lab's logs name another one
    samples = [{"t": T0 + i * 0.25, "replica": "r1", "healthy": True} for i in range(17)]
    res = health_disagreement(samples, [held], replica_of=mapping)  # the retry's record absent
    assert res["disagreement_s"] > 0  # nothing else names r1 for it: the map stands
    res = health_disagreement(samples, [held, retry], replica_of=mapping)
    assert res["disagreement_s"] == 0
