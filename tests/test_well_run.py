"""The well-run reference service (issue 23 item 5): ``examples/well-run/gameday.yaml``, the
default game day's lab and shipped experiments with each drill's fix applied by plan options only,
run once on one lab, as a user would.

What it must show (README, "What the default game day finds"): every drill whose fix is a plan
option passes; a drill fails only for what no plan option can fix, each checked against the lab's
ground truth:

* a stream the fault itself cut (in flight on the replica the fault killed or whose node it
  dropped, its generation aborted) and that the client retried on a survivor is a *re-run* the
  fault caused (``rerun_generations``, the fault's cost), not a duplicate the client caused: so
  oom-kill, simultaneous-restarts and node-loss pass, with ``rerun_generations`` equal to the
  streams the lab's fault record and engine ledger say the fault cut, and no duplicate;
* upstream-timeout's requests held by the frozen replica before HAProxy's checks eject it are
  ``hung_requests`` (the client's part of the fix holds them about 3 s at most, not 10 s),
  blamed on the gateway (sent after the freeze: no first-byte timeout) or, for a stream already
  streaming when it froze, on the fault; retried by the client and ended ``cancelled`` by the
  thawed engine at once, they are the freeze's re-runs (``rerun_generations``), not duplicates;
  only a generation the thawed engine went on with (``frozen_completed``) is a duplicate, blamed
  on the engine (README; issue 30).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from labutil import SEVEN_DRILLS, check_verdict, run_gameday

from chaoslib_infer.load.records import read_records

ROOT = Path(__file__).resolve().parent.parent
PLAN = ROOT / "examples" / "well-run" / "gameday.yaml"
pytestmark = [pytest.mark.lab, pytest.mark.slow]

#: the retry-cost criteria: what the client's and gateway's retries cost (module docstring)
RETRY_COST = {"duplicate_generations", "extra_generations", "wasted_tokens"}
#: how a stream the fault cut fails at the client (a killed replica; a dropped node)
CUT_CLASSES = {"reset", "truncated", "timeout_idle", "timeout_ttft"}
#: the drills the plan's options fix: all but upstream-timeout
PASSING = [d for d in SEVEN_DRILLS if d != "upstream-timeout"]
#: upstream-timeout's rows that need the gateway's first-byte timeout (HAProxy's user config)
GATEWAY_PART = {"hung_requests", "max_wait_s"}


def _failing(drill: dict[str, Any]) -> set[str]:
    return {r["criterion"] for r in drill["verdict"]["rows"] if r["result"] == "fail"}


def _cut_by_the_fault(drill_dir: Path, lab_dir: Path) -> int:
    """Logical requests whose first attempt the fault cut, from the lab's own records: a
    request in flight on a replica the fault took (the lab's fault record: ``replica`` or
    ``replicas``; the attempt's ``replica``, or without one the engine ledger's ``generation``
    line of the request on that replica; sent before the fault, ended after it) that failed
    (``reset``/``truncated`` from a killed replica; ``timeout_idle`` or ``timeout_ttft`` when its
    node was dropped: the stream went silent), whose generation there the engine never ended
    (no ``generation_end`` line by the fault's time: the process died under it, or a line after
    it was written into a cut link), and that a later attempt served."""
    faults = [json.loads(line) for line in (drill_dir / "faults.jsonl").read_text().splitlines()]
    taken = {r for f in faults for r in (f.get("replicas") or [f.get("replica")]) if r}
    fault_at = min(float(f["fault_at"]) for f in faults)
    ledger = [json.loads(line) for line in (lab_dir / "ledger.jsonl").read_text().splitlines()]
    started = {
        (e["request_id"], e["replica"])
        for e in ledger
        if e.get("event", "generation") == "generation"
    }
    ended = {  # finished by the fault: a line after it went into a cut link (faultcut.py)
        (e["request_id"], e["replica"])
        for e in ledger
        if e.get("event") == "generation_end" and float(e["t"]) <= fault_at
    }
    by_request: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for rec in read_records(drill_dir / "records.jsonl"):
        by_request[rec["request_id"]].append(rec)
    cut = 0
    for rid, attempts in by_request.items():
        first, last = (
            min(attempts, key=lambda a: a["attempt"]),
            max(attempts, key=lambda a: a["attempt"]),
        )
        on = [first["replica"]] if first.get("replica") else sorted(taken)
        aborted = any(
            rep in taken and (rid, rep) in started and (rid, rep) not in ended for rep in on
        )
        if (
            not first.get("ok")
            and first.get("error_class") in CUT_CLASSES
            and aborted
            and first["sent_at"] <= fault_at <= first["end_at"]
            and last.get("ok")
            and last is not first
        ):
            cut += 1
    return cut


def _cut_by_the_freeze(drill_dir: Path, lab_dir: Path, grace_s: float = 0.5) -> int:
    """Generations the freeze cut and the client re-ran, from the lab's own records: a failed
    attempt sent before the thaw (the lab's ``cleared`` event) that ended after the freeze, whose
    request's generation on the frozen replica ended ``cancelled`` by ``grace_s`` after the thaw,
    and that another generation of the request re-ran."""
    faults = [json.loads(line) for line in (drill_dir / "faults.jsonl").read_text().splitlines()]
    freeze = next(f for f in faults if f.get("phase", "injected") == "injected")
    at, rep = float(freeze["fault_at"]), freeze["replica"]
    events = [json.loads(line) for line in (lab_dir / "events.jsonl").read_text().splitlines()]
    thaw = min(  # this freeze's clear: an earlier drill may have cleared a fault on rep too
        float(e["t"])
        for e in events
        if e.get("event") == "fault"
        and e.get("phase") == "cleared"
        and e.get("replica") == rep
        and float(e["t"]) >= at
    )
    ledger = [json.loads(line) for line in (lab_dir / "ledger.jsonl").read_text().splitlines()]
    gens: dict[str, list[str]] = defaultdict(list)
    cancelled = set()
    for e in ledger:
        if e.get("event", "generation") == "generation":
            gens[e["request_id"]].append(e["replica"])
        elif (
            e.get("event") == "generation_end"
            and e["replica"] == rep
            and e.get("outcome") == "cancelled"
            and at <= float(e["t"]) <= thaw + grace_s
        ):
            cancelled.add(e["request_id"])
    held = {
        rec["request_id"]
        for rec in read_records(drill_dir / "records.jsonl")
        if not rec.get("ok")
        and rec.get("replica") in (None, rep)
        and rec["sent_at"] < thaw
        and rec["end_at"] >= at
    }
    return sum(1 for rid in held & cancelled if len(gens[rid]) > 1)


@pytest.mark.timeout(1200)  # the game day: ~5 min alone, longer beside other labs
def test_the_well_run_plan_passes_what_plan_options_can_fix(tmp_path: Path) -> None:
    out = tmp_path / "wellrun"
    proc, summary = run_gameday(PLAN, out, timeout_s=1500)
    drills = {d["name"]: d for d in summary["drills"]}
    assert list(drills) == list(SEVEN_DRILLS), proc.stdout[-2000:]
    for name, drill in drills.items():
        check_verdict(drill)
        figures = drill["figures"]
        # the client's retries hid every failure the faults caused: no request lost
        assert figures.get("request_availability", figures["availability"]) == 1.0, name
    for name in PASSING:  # fixed by plan options; a re-run the fault caused is the fault's
        assert drills[name]["status"] == "passed", (name, drills[name]["reasons"])
        assert drills[name]["figures"]["duplicate_generations"] == 0, name
    # the warm-up fix: the restarted replica's first requests as fast as the rest
    assert drills["oom-kill"]["figures"]["warmup_ratio"] < 2.0
    for name in ("node-loss", "oom-kill", "simultaneous-restarts"):
        figures = drills[name]["figures"]
        # every second generation is a stream the fault cut and the client retried elsewhere:
        # the lab's fault record and ledger (ground truth) against the rerun figure
        cut = _cut_by_the_fault(out / name, out / "lab")
        assert figures["rerun_generations"] == cut, (name, figures["rerun_generations"], cut)
        assert figures["fault_cut_generations"] >= cut, name
    upstream = drills["upstream-timeout"]
    failing = _failing(upstream)
    assert failing <= RETRY_COST | GATEWAY_PART, upstream["reasons"]
    fig = upstream["figures"]
    # a stream the freeze held, retried by the client and cancelled by the thawed engine at once
    # is the fault's re-run; a duplicate is only a generation the thawed engine went on with
    assert fig["duplicate_generations"] == fig["frozen_completed"], fig
    assert fig["rerun_generations"] == _cut_by_the_freeze(out / "upstream-timeout", out / "lab")
    for line in upstream["reasons"]:
        if "(hung_requests)" in line or "(max_wait_s)" in line:
            # each hung request's own record: sent after the freeze (the gateway's) or already
            # streaming when it froze (the fault's)
            assert "; BLAME: gateway (" in line or "; BLAME: fault (" in line, line
        elif any(f"({c})" in line for c in RETRY_COST):
            assert "; BLAME: engine (" in line, line
    hung_max = fig.get("hung_request_max_s")
    # the client's part: its 3 s first-token and 2 s idle timeouts (the plan), not 10 s
    assert hung_max is None or hung_max <= 3.5
    # exit code 1 exactly when a drill failed
    assert proc.returncode == (1 if any(d["status"] == "failed" for d in drills.values()) else 0)
