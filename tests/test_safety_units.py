"""Unit tests of the safety modules: allowlist, redaction, stop-condition arithmetic, ledger, dead-man
deadlines, the guard control's in-process abort (no lab needed)."""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from chaoslib.experiment import run_experiment

from chaoslib_infer.errors import ConfigError
from chaoslib_infer.lab import deadman, ledger
from chaoslib_infer.lab.fleet import DEFAULT_FAULT_TTL_S, LabError
from chaoslib_infer.safety import allowlist, guard, redact

# ---- allowlist ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8800",
        "https://127.3.4.5",
        "http://localhost:1/v1",
        "http://LOCALHOST:9",
        "http://[::1]:8000/x",
    ],
)
def test_default_allowlist_is_loopback(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(allowlist.ENV_VAR, raising=False)
    assert allowlist.is_allowed(url, allowlist.allow_patterns())


@pytest.mark.parametrize(
    "url",
    [
        "http://10.0.0.1:8000",
        "https://api.openai.com",
        "http://127.0.0.1.nip.io:80",
        "http://[::2]:80",
        "http://0.0.0.0:80",
        "http://localhost.evil.example:80",
    ],
)
def test_default_allowlist_refuses_the_rest(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(allowlist.ENV_VAR, raising=False)
    assert not allowlist.is_allowed(url, allowlist.allow_patterns())
    with pytest.raises(ConfigError) as err:
        allowlist.check_target(url)
    assert "outside the allowlist" in str(err.value) and "\n" not in str(err.value)
    assert "--allow" in str(err.value)


def test_allow_patterns_scheme_host_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(allowlist.ENV_VAR, raising=False)
    pats = allowlist.allow_patterns(
        ["https://*.corp.example", "http://10.0.0.0/8:*", "http://[fd00::]/8:8000"]
    )
    assert allowlist.is_allowed("https://llm.corp.example/v1", pats)
    assert not allowlist.is_allowed("https://llm.corp.example:8443", pats)  # default port only
    assert not allowlist.is_allowed("http://llm.corp.example", pats)  # scheme must match
    assert allowlist.is_allowed("http://10.200.3.4:1234", pats)
    assert not allowlist.is_allowed("https://10.200.3.4:1234", pats)
    assert allowlist.is_allowed("http://[fd12::1]:8000", pats)
    assert not allowlist.is_allowed("http://[fd12::1]:8001", pats)
    monkeypatch.setenv(allowlist.ENV_VAR, "https://a.example:443, http://b.example:81")
    pats = allowlist.allow_patterns()
    assert allowlist.is_allowed("https://a.example", pats)
    assert allowlist.is_allowed("http://b.example:81", pats)


def test_plan_allow_field(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(allowlist.ENV_VAR, raising=False)
    plan = tmp_path / "plan.yaml"
    plan.write_text("allow: ['http://192.168.1.5:8000']\ndrills: []\n")
    allowlist.check_target("http://192.168.1.5:8000", plan_path=plan)
    with pytest.raises(ConfigError):
        allowlist.check_target("http://192.168.1.6:8000", plan_path=plan)
    plan.write_text("allow: http://x\n")
    with pytest.raises(ConfigError, match="allow: expected a list"):
        allowlist.allow_patterns(plan_path=plan)


@pytest.mark.parametrize(
    "bad",
    ["10.0.0.1", "ftp://x:1", "*://x", "http://x:99999", "http://host/8:*", "http://300.1.1.1/8:*"],
)
def test_malformed_patterns_are_config_errors(bad: str) -> None:
    with pytest.raises(ConfigError):
        allowlist.parse_pattern(bad)


@pytest.mark.parametrize("bad", ["", "not a url", "ftp://x", "http://", "http://[::1"])
def test_malformed_targets_are_config_errors(bad: str) -> None:
    with pytest.raises(ConfigError):
        allowlist.check_target(bad)


# ---- redaction ------------------------------------------------------------------------------
KEY = "sk-test-9f8e7d6c5b4a"


def test_redact_text_all_forms() -> None:
    odd = 'k3y/with"quote+plus'
    forms = [odd, json.dumps(odd)[1:-1], "k3y%2Fwith%22quote%2Bplus", f"Bearer {KEY}"]
    out = redact.redact_text(" | ".join(forms), [KEY, odd])
    assert out == " | ".join([redact.REDACTED] * 3 + [f"Bearer {redact.REDACTED}"])
    assert redact.redact_text("short abc", ["abc"]) == "short [REDACTED]"  # explicit list
    assert redact.known_secrets(["abc"]) == []  # but too short to be collected


def test_scrub_tree_rewrites_files_keeps_mode_and_others(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    hit = tmp_path / "a" / "journal.json"
    hit.write_text(json.dumps({"k": KEY, "nested": {"h": f"Bearer {KEY}"}}))
    os.chmod(hit, 0o640)
    miss = tmp_path / "records.jsonl"
    miss.write_text('{"ok": true}\n')
    before = miss.stat().st_mtime_ns
    (tmp_path / "link").symlink_to(hit)
    changed = redact.scrub_tree(tmp_path, [KEY])
    assert changed == {"a/journal.json": 2}
    assert KEY not in hit.read_text()
    assert json.loads(hit.read_text())["k"] == redact.REDACTED
    assert oct(hit.stat().st_mode & 0o777) == "0o640"
    assert miss.stat().st_mtime_ns == before
    assert not list(tmp_path.rglob(".*redact*"))


def test_known_secrets_sources(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(redact.API_KEY_ENV, KEY)
    monkeypatch.setenv("MY_TOKEN", "tok-123456789")
    monkeypatch.setenv(redact.EXTRA_ENV, "MY_TOKEN")
    monkeypatch.setenv("OTHER_SECRET", "hunter2hunter2")
    experiment = {
        "secrets": {
            "target": {"key": {"type": "env", "key": "OTHER_SECRET"}, "inline": "abcdefgh"}
        },
        "configuration": {
            "infer_api_key": {"type": "env", "key": "MY_TOKEN"},
            "window_s": {"type": "env", "key": "HOME"},  # not secret-looking: not scrubbed
        },
    }
    found = redact.known_secrets(redact.secrets_from_experiment(experiment))
    assert set(found) == {KEY, "tok-123456789", "hunter2hunter2", "abcdefgh"}
    key_file = tmp_path / "key"
    key_file.write_text(f"  {KEY}\n")
    assert redact.read_key_file(key_file) == KEY
    key_file.write_text("abc")
    with pytest.raises(ValueError, match="at least"):
        redact.read_key_file(key_file)
    with pytest.raises(ValueError, match="cannot read"):
        redact.read_key_file(tmp_path / "missing")


def test_redacting_filter(tmp_path: Path) -> None:
    log = logging.getLogger("chaos-infer-test-redact")
    handler = logging.FileHandler(tmp_path / "x.log")
    handler.addFilter(redact.RedactingFilter([KEY]))
    log.addHandler(handler)
    try:
        log.warning("calling with %s", {"Authorization": f"Bearer {KEY}"})
        try:
            raise RuntimeError(f"401 for key {KEY}")
        except RuntimeError:
            log.exception("failed")
    finally:
        log.removeHandler(handler)
        handler.close()
    text = (tmp_path / "x.log").read_text()
    assert KEY not in text
    assert text.count(redact.REDACTED) == 2


# ---- stop conditions --------------------------------------------------------------------------
def _samples(t0: float, n: int, ok: bool, step: float = 0.1) -> list[tuple[float, bool]]:
    return [(t0 + i * step, ok) for i in range(n)]


def test_window_figures_and_burn_rate() -> None:
    s = _samples(100.0, 10, True) + _samples(101.0, 10, False)
    fig = guard.window_figures(s, now=102.0, window_s=2.0, slo_availability=0.99)
    assert fig["requests"] == 19  # end_at 100.0 is outside (now - window, now]
    assert fig["availability"] == pytest.approx(9 / 19)
    assert fig["burn_rate"] == pytest.approx((10 / 19) / 0.01)
    assert guard.window_figures([], 1.0, 1.0, 0.999)["availability"] is None
    assert math.isinf(guard.window_figures(s, 102.0, 2.0, 1.0)["burn_rate"])


def test_tracker_needs_a_sustained_breach() -> None:
    c = guard.StopConditions(availability_floor=0.5, window_s=2.0, for_s=2.0, min_requests=5)
    t = guard.Tracker(c)
    good = _samples(0.0, 20, True)
    assert t.check(good, 2.0) is None
    bad = good + _samples(2.0, 30, False)
    assert t.check(bad, 4.0) is None  # breach starts at 4.0
    assert t.check(bad, 5.0) is None
    trip = t.check(bad, 6.0)
    assert trip is not None and trip.guard == "availability_floor"
    assert trip.since == 4.0 and trip.at == 6.0 and trip.value < 0.5
    assert "availability" in trip.reason() and "for 2.0 s" in trip.reason()
    # a recovered check resets the breach
    t2 = guard.Tracker(c)
    assert t2.check(bad, 4.0) is None
    assert t2.check(good + _samples(4.5, 30, True), 5.0) is None
    assert t2.since["availability_floor"] is None


def test_tracker_thin_windows_neither_confirm_nor_clear() -> None:
    c = guard.StopConditions(availability_floor=0.5, window_s=1.0, for_s=2.0, min_requests=5)
    t = guard.Tracker(c)
    bad = _samples(0.1, 9, False)
    assert t.check(bad, 1.0) is None and t.since["availability_floor"] == 1.0
    assert t.check(bad, 2.5) is None  # empty window: breach kept
    assert t.since["availability_floor"] == 1.0
    trip = t.check(bad + _samples(2.6, 9, False), 3.5)
    assert trip is not None and trip.since == 1.0


def test_tracker_burn_rate_guard() -> None:
    c = guard.StopConditions(
        availability_floor=None, max_burn_rate=50.0, window_s=5, for_s=0, slo_availability=0.999
    )
    t = guard.Tracker(c)
    s = _samples(0.0, 96, True, 0.05) + _samples(0.0, 4, False, 0.05)  # 4 % errors: burn 40
    assert t.check(s, 5.0) is None
    s += _samples(5.0, 10, False, 0.01)  # 14/110 errors: burn ~127
    trip = t.check(s, 5.5)
    assert trip is not None and trip.guard == "max_burn_rate" and trip.value > 50


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ({"window": 3}, "unknown stop condition"),
        ({"availability_floor": 2}, "availability_floor"),
        ({"for_s": -1}, "for_s"),
        ({"window_s": "abc"}, "expected a number"),
        ({"availability_floor": None}, "set availability_floor and/or max_burn_rate"),
        ({"min_requests": True}, "expected a number"),
        ({"slo_availability": "nan"}, "slo_availability"),
    ],
)
def test_stop_conditions_validation(raw: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        guard.StopConditions.from_mapping(raw)


def test_stop_conditions_from_strings_and_plan(tmp_path: Path) -> None:
    c = guard.StopConditions.from_mapping(
        {"availability_floor": "0.4", "window_s": "3", "min_requests": "2.0"}
    )
    assert c.availability_floor == 0.4 and c.window_s == 3.0 and c.min_requests == 2
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "stop_conditions: {availability_floor: 0.5, window_s: 4}\n"
        "drills:\n"
        "  - {name: a, experiment: e.yaml}\n"
        "  - {name: b, experiment: e.yaml, stop_conditions: {for_s: 1}}\n"
        "  - {name: c, experiment: e.yaml, stop_conditions: false}\n"
    )
    assert guard.plan_stop_conditions(plan, "a") == {"availability_floor": 0.5, "window_s": 4}
    assert guard.plan_stop_conditions(plan, "b") == {
        "availability_floor": 0.5,
        "window_s": 4,
        "for_s": 1,
    }
    assert guard.plan_stop_conditions(plan, "c") is None
    plan.write_text("stop_conditions: {availability_floor: 7}\ndrills: []\n")
    with pytest.raises(ConfigError, match="availability_floor"):
        guard.plan_stop_conditions(plan, "a")


def test_record_tail_reads_only_complete_lines(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    tail = guard.RecordTail(path, keep_s=10)
    assert list(tail.poll(100.0)) == []
    with path.open("w") as fh:
        fh.write(json.dumps({"end_at": 95.0, "ok": True}) + "\n")
        fh.write(json.dumps({"end_at": 99.0, "ok": False}) + "\n")
        fh.write('{"end_at": 99.5, "ok": tr')  # torn last line: not yet
    assert list(tail.poll(100.0)) == [(95.0, True), (99.0, False)]
    with path.open("a") as fh:
        fh.write('ue}\nnot json\n{"ok": true}\n')
    assert list(tail.poll(100.0))[-1] == (99.5, True)
    assert [s[0] for s in tail.poll(107.0)] == [99.0, 99.5]  # 95 dropped (keep 10 s)
    path.write_text(json.dumps({"end_at": 106.0, "ok": True}) + "\n")  # replaced: shorter
    assert list(tail.poll(107.0)) == [(106.0, True)]


# ---- the guard control, in-process (a fake records feed, no lab) ------------------------------
def _feed(path: Path, stop: threading.Event, ok: bool) -> None:
    with path.open("a") as fh:
        while not stop.is_set():
            fh.write(json.dumps({"end_at": time.time(), "ok": ok}) + "\n")
            fh.flush()
            time.sleep(0.05)


def _experiment(run_dir: Path, marker: Path, pause_s: float) -> dict[str, Any]:
    return {
        "version": "1.0.0",
        "title": "guard unit",
        "description": "x",
        "configuration": {"infer_run_dir": str(run_dir), "slo_availability": "0.999"},
        "controls": [
            {
                "name": "stop-conditions",
                "provider": {
                    "type": "python",
                    "module": "chaoslib_infer.controls.guard",
                    "arguments": {"availability_floor": 0.5, "window_s": 1, "for_s": 0.5},
                },
            }
        ],
        "method": [
            {
                "type": "probe",
                "name": "wait",
                "provider": {
                    "type": "python",
                    "module": "chaoslib_infer.lab.testfault",
                    "func": "echo",
                    "arguments": {"value": 1},
                },
                "pauses": {"after": pause_s},
            }
        ],
        "rollbacks": [
            {
                "type": "action",
                "name": "touch-marker",
                "provider": {
                    "type": "process",
                    "path": "touch",
                    "arguments": str(marker),
                },
            }
        ],
        "runtime": {"rollbacks": {"strategy": "always"}},
    }


@pytest.mark.parametrize("ok", [False, True])
def test_guard_control_aborts_in_process_and_rollbacks_play(tmp_path: Path, ok: bool) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    marker = tmp_path / "rolled-back"
    stop = threading.Event()
    feeder = threading.Thread(target=_feed, args=(run_dir / "records.jsonl", stop, ok))
    feeder.start()
    before = signal.getsignal(signal.SIGUSR1)
    t0 = time.monotonic()
    try:
        journal = run_experiment(
            _experiment(run_dir, marker, 4.0 if ok else 30.0),
            settings={"runtime": {"rollbacks": {"strategy": "always"}}},
        )
    finally:
        stop.set()
        feeder.join()
    took = time.monotonic() - t0
    assert marker.exists()  # the rollback played in both cases
    assert journal["rollbacks"][0]["status"] == "succeeded"
    if ok:
        assert journal["status"] == "completed"
        assert "stop_condition" not in journal
        assert not (run_dir / "stop_condition.json").exists()
    else:
        # the 30 s pause was cut short: trip after ~1 s window + 0.5 s sustain + 1 s checks
        assert took < 6.0, took
        assert journal["status"] == "interrupted"
        stop_condition = journal["stop_condition"]
        assert stop_condition["guard"] == "availability_floor"
        assert stop_condition["value"] == 0.0 and stop_condition["threshold"] == 0.5
        on_disk = json.loads((run_dir / "stop_condition.json").read_text())
        assert on_disk["at"] == stop_condition["at"]
    assert signal.getsignal(signal.SIGUSR1) == before  # the control put the handler back


def test_guard_control_refuses_bad_conditions(tmp_path: Path) -> None:
    exp = _experiment(tmp_path, tmp_path / "m", 0.0)
    exp["controls"][0]["provider"]["arguments"] = {"availability_floor": 5}
    journal = run_experiment(exp, settings={"runtime": {"rollbacks": {"strategy": "always"}}})
    assert journal["status"] == "interrupted"
    assert journal["run"] == []  # the method never ran without its guard


# ---- ledger and dead-man deadlines ------------------------------------------------------------
def test_ledger_pending_and_refusal(tmp_path: Path) -> None:
    assert ledger.pending_faults(tmp_path) == []
    ledger.refuse_if_pending(tmp_path)
    (tmp_path / "faults.json").write_text(
        json.dumps([{"kind": "test-marker", "id": "test-marker-1", "ttl_s": 5}])
    )
    with pytest.raises(LabError) as err:
        ledger.refuse_if_pending(tmp_path)
    assert "chaos-infer rollback --state-dir" in str(err.value)
    assert "test-marker-1" in str(err.value)
    (tmp_path / "faults.json").write_text("[{")
    with pytest.raises(LabError, match="not valid JSON"):
        ledger.pending_faults(tmp_path)
    result = ledger.rollback(tmp_path)  # no lab.json: nothing is done
    assert not result.lab_found and result.undone == []


def test_deadman_deadline() -> None:
    assert deadman.deadline({"injected_at": 100.0, "ttl_s": 5}) == 105.0
    assert deadman.deadline({"injected_at": 100.0}) == 100.0 + DEFAULT_FAULT_TTL_S
    assert deadman.deadline({"injected_at": 100.0, "ttl_s": 5, "deadman_retry_at": 200}) == 200
    assert deadman.deadline({"ttl_s": "x"}) == 0.0


def test_guard_interrupts_only_hypotheses_and_method_never_rollbacks() -> None:
    import sys

    from chaoslib_infer.controls.guard import _interruptible

    def chaoslib_func(name: str, body: str) -> Any:
        scope: dict[str, Any] = {"__name__": "chaoslib.fake", "sys": sys}
        exec(f"def {name}(inner=None):\n    {body}\n", scope)
        return scope[name]

    probe = chaoslib_func("execute_activity", "return sys._getframe()")
    method = chaoslib_func("run_method", "return inner()")
    rollback = chaoslib_func("run_rollback", "return inner()")
    assert _interruptible(method(probe)) is True
    assert _interruptible(rollback(lambda: method(probe))) is False  # rollbacks always win
    assert _interruptible(probe()) is False  # outside any phase (e.g. after the experiment)
    assert _interruptible(sys._getframe()) is False


def test_add_fault_records_ttl_and_deadman_expires_it(tmp_path: Path) -> None:
    from chaoslib_infer.lab.fleet import Lab

    lab = Lab(tmp_path, {"replicas": []})
    marker = tmp_path / "marker"
    rec = {"kind": "test-marker", "module": "chaoslib_infer.lab.testfault", "path": str(marker)}
    fid = lab.add_fault(dict(rec))
    marker.write_text(fid)  # the marker holds its fault id (the undo removes only its own)
    assert ledger.pending_faults(tmp_path)[0]["ttl_s"] == DEFAULT_FAULT_TTL_S
    assert lab.remove_fault(fid) == f"test-marker {fid}: removed {marker}"
    for bad in (0, -1, "x", True, float("inf")):
        with pytest.raises(LabError, match="ttl_s"):
            lab.add_fault({**rec, "ttl_s": bad})
    fid = lab.add_fault({**rec, "ttl_s": "2"})
    marker.write_text(fid)
    injected = ledger.pending_faults(tmp_path)[0]["injected_at"]
    assert deadman.expire_once(lab, now=injected + 1.9) == []
    lines = deadman.expire_once(lab, now=injected + 2.0)
    assert lines == [f"expired test-marker {fid} (ttl 2.0 s): test-marker {fid}: removed {marker}"]
    assert not marker.exists() and ledger.pending_faults(tmp_path) == []
    events = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [e["phase"] for e in events if e.get("fault_id") == fid] == ["injected", "expired"]
    # an undo that cannot run keeps the record (retried later), it is never forgotten: here a
    # marker path that is a folder, which the test-marker undo refuses to touch
    fid = lab.add_fault({**rec, "path": str(tmp_path)})
    (line,) = deadman.expire_once(lab, now=time.time() + 10 * DEFAULT_FAULT_TTL_S)
    assert "undo REFUSED" in line and "is not a regular file" in line
    (kept,) = ledger.pending_faults(tmp_path)
    assert kept["id"] == fid and kept["deadman_retry_at"] > time.time()
    with lab.edit_faults() as faults:
        faults.clear()
    # a kind its module does not own is refused before the module is even asked
    fid = lab.add_fault({"kind": "test-bogus", "module": "chaoslib_infer.lab.testfault"})
    (line,) = deadman.expire_once(lab, now=time.time() + 10 * DEFAULT_FAULT_TTL_S)
    assert "undo REFUSED" in line and "not a kind of chaoslib_infer.lab.testfault" in line
    (kept,) = ledger.pending_faults(tmp_path)
    assert kept["id"] == fid and kept["deadman_retry_at"] > time.time()


def test_held_interrupts_defers_one_signal_and_lets_a_second_through() -> None:
    """Between an exec that starts a process and the state that records it, SIGINT/SIGTERM wait
    (then reach the run's own handler); a second one inside the block is not held."""
    import os
    import signal

    from chaoslib_infer.safety.signals import held_interrupts

    got: list[int] = []

    def mine(signum: int, frame: Any) -> None:
        got.append(signum)

    previous = signal.signal(signal.SIGTERM, mine)
    try:
        with held_interrupts() as held:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
            assert got == [] and held == [signal.SIGTERM]
        assert got == [signal.SIGTERM]  # delivered after the block
        assert signal.getsignal(signal.SIGTERM) is mine
        with pytest.raises(KeyboardInterrupt), held_interrupts():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
            pytest.fail("a second signal must not be held")
        assert got == [signal.SIGTERM] and signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, previous)
