"""Evidence timeline pieces on hand-made data: the replica-count series and plot, the per-drill
fault and recovery markers, relative-time table cells, the per-request P99 beside the attempt
P99, the upstream-timeout interruption with late (hung) failures, and the recorder's HAProxy
``lb_state`` snapshots against a real HAProxy.
"""

from __future__ import annotations

import http.server
import json
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from labutil import haproxy_missing
from PIL import Image

from chaoslib_infer.drills.upstream_timeout import figures as upstream_timeout
from chaoslib_infer.evidence.figures import (
    FAULT,
    MILESTONE,
    RECOVERY,
    REMOVED,
    common_figures,
    kind_module,
    replica_count_series,
    timeline_markers,
    unix_time,
)
from chaoslib_infer.evidence.plots import drill_plots, replica_count_plot
from chaoslib_infer.evidence.render import fmt_cell, render_drill
from chaoslib_infer.gameday import _headline
from chaoslib_infer.lab.haproxy import find_haproxy
from chaoslib_infer.lab.recorder import Recorder, lb_status, read_events
from chaoslib_infer.measure import figures as mfig

T0 = 1_800_000_000.0


def _ev(t: float, event: str, replica: str | None = None, **kw: Any) -> dict[str, Any]:
    return {"t": T0 + t, "event": event, "replica": replica, **kw}


def _lb(t: float, **servers: str) -> dict[str, Any]:
    return _ev(t, "lb_state", None, servers=servers)


# -- replica count series ---------------------------------------------------------------------


def _life() -> list[dict[str, Any]]:
    """r0..r2 up before the drill; r1 OOM-killed at 10 (HAProxy DOWN at 10.3), ready at 11.5,
    UP at 12; r2 frozen at 20 (process stays ready), ejected at 22, UP again at 30."""
    return [
        _ev(-5.0, "start", "r0"),
        _ev(-5.0, "start", "r1"),
        _ev(-5.0, "start", "r2"),
        _ev(-3.0, "ready", "r0"),
        _ev(-3.0, "ready", "r1"),
        _ev(-2.9, "ready", "r2"),
        _lb(-2.5, r0="UP", r1="UP", r2="UP", r3="MAINT"),
        _ev(10.0, "exit", "r1", cause="oom"),
        _ev(10.02, "start", "r1"),
        _lb(10.3, r0="UP", r1="DOWN", r2="UP", r3="MAINT"),
        _ev(11.5, "ready", "r1"),
        _lb(12.0, r0="UP", r1="UP", r2="UP", r3="MAINT"),
        _ev(20.0, "fault", None, kind="upstream-timeout", phase="injected"),
        _lb(22.0, r0="UP", r1="UP", r2="DOWN", r3="MAINT"),
        _lb(30.0, r0="UP", r1="UP", r2="UP", r3="MAINT"),
        _ev(45.0, "exit", "r0"),  # after the drill: not in the series
    ]


def test_replica_count_series_from_lab_events() -> None:
    s = replica_count_series(_life(), T0, T0 + 40.0)
    assert s is not None and s["lb_tracked"] is True
    assert s["replicas"] == ["r0", "r1", "r2", "r3"]
    rel = [round(t - T0, 3) for t in s["t"]]
    assert rel == [0.0, 10.0, 10.3, 11.5, 12.0, 22.0, 30.0, 40.0]
    # serving needs both: engine ready and HAProxy UP; the standby r3 (MAINT, never started) never
    assert s["serving"] == [3, 2, 2, 2, 3, 2, 3, 3]
    assert s["ready"] == [3, 2, 2, 3, 3, 3, 3, 3]  # the frozen r2 stays "ready" for the recorder
    assert s["lb_up"] == [3, 3, 2, 2, 3, 2, 3, 3]


def test_replica_count_series_counts_a_replica_served_through_its_detour() -> None:
    # network-jitter: r0's own server in maintenance, its traffic through the shim's r0-jitter
    events = [
        *(_ev(-3.0, "ready", r) for r in ("r0", "r1")),
        _lb(-2.0, r0="UP", r1="UP"),
        _lb(5.0, r0="MAINT", r1="UP", **{"r0-jitter": "UP"}),
        _lb(25.0, r0="UP", r1="UP", **{"r0-jitter": "MAINT"}),
        _lb(26.0, r0="UP", r1="UP"),
        _lb(
            30.0, r0="DOWN", r1="UP", **{"r0-jitter": "UP"}
        ),  # detour UP, replica DOWN: still served
    ]
    s = replica_count_series(events, T0, T0 + 40.0)
    assert s is not None and s["replicas"] == ["r0", "r1"]  # the detour is not a replica
    assert s["serving"] == [2, 2] and s["lb_up"] == [2, 2]


def test_replica_count_series_without_haproxy_samples_and_without_replicas() -> None:
    old = [e for e in _life() if e["event"] != "lb_state"]  # a lab from before lb_state
    s = replica_count_series(old, T0, T0 + 40.0)
    assert s is not None and s["lb_tracked"] is False and s["lb_up"] is None
    assert s["serving"] == s["ready"] == [3, 2, 3, 3]
    assert [round(t - T0, 3) for t in s["t"]] == [0.0, 10.0, 11.5, 40.0]
    assert (
        replica_count_series([_ev(1.0, "fault", None, kind="x", phase="injected")], T0, T0 + 5)
        is None
    )


def test_replica_count_plot_is_a_real_png(tmp_path: Path) -> None:
    s = replica_count_series(_life(), T0, T0 + 40.0)
    assert s is not None
    out = replica_count_plot(
        s,
        tmp_path / "rc.png",
        "drill: serving replicas",
        T0,
        [(T0 + 10.0, "r1 OOM-killed", MILESTONE), (T0 + 12.0, "r1 UP", RECOVERY)],
        [(2.0, "planned instances (capacity formula): 2", "#9467bd")],
    )
    with Image.open(out) as img:
        w, h = img.size
        assert img.format == "PNG" and w > 900 and h > 300
        # the key beside the axes widened the canvas past the 10-inch figure
        assert w > 10 * 110


# -- markers ------------------------------------------------------------------------------------


def test_markers_oom_kill_from_ledger_events_and_ground_truth() -> None:
    faults = [{"kind": "oom-kill", "fault_at": T0 + 10.0, "replica": "r1"}]
    events = [
        _ev(9.0, "fault", "r1", kind="oom-kill", phase="injected"),
        _ev(10.1, "fault", "r1", kind="oom-kill", phase="cleared"),
        _ev(100.0, "fault", "r1", kind="oom-kill", phase="injected"),  # another drill: outside
    ]
    ground = {
        "replica": "r1",
        "death_cause": "oom",
        "replica_died_at": T0 + 10.0,
        "replica_ready_at": T0 + 11.5,
        "replica_serving_again_at": T0 + 11.8,
    }
    got = timeline_markers(faults, events, ground, {}, T0, T0 + 40.0)
    assert got == [
        (T0 + 9.0, "memory hog started", FAULT),
        (T0 + 10.0, "r1 OOM-killed", MILESTONE),
        (T0 + 10.1, "memory hog removed", REMOVED),
        (T0 + 11.5, "r1 ready (health 200)", RECOVERY),
        (T0 + 11.8, "r1 serving again", RECOVERY),
    ]


def test_markers_traffic_spike_merge_and_stop_condition() -> None:
    faults = [{"kind": "traffic-spike", "fault_at": T0 + 12.0}]
    ground = {
        "fault_at": T0 + 12.0,
        "spike_end_at": T0 + 27.0,
        "scale_out_replica": "r3",
        "queue_depth_at_trigger": 5.0,
        "scale_out_triggered_at": T0 + 14.8,
        "scale_out_ready_at": T0 + 16.2,
        "scale_out_enabled_at": T0 + 16.21,
        "scale_out_serving_at": T0 + 16.23,
    }
    got = timeline_markers(
        faults, [], ground, {"recovery_s": 2.0}, T0, T0 + 40, {"at": T0 + 30.0, "guard": "p99"}
    )
    assert got == [
        # no lab events: the fault log's fault_at, the same instant and colour as the spike start
        (T0 + 12.0, "spike scheduled (profile load started); spike starts", FAULT),
        (T0 + 14.8, "scale-out triggered (r3, queue 5.0)", MILESTONE),
        (T0 + 16.2, "r3 ready; r3 enabled in HAProxy; r3 serving", RECOVERY),  # < 50 ms apart
        (T0 + 27.0, "spike ends", REMOVED),
        (T0 + 29.0, "P99 and errors back in baseline", RECOVERY),
        (T0 + 30.0, "stop condition: p99", "#ff7f0e"),
    ]


@pytest.mark.parametrize(
    ("kind", "ground", "figures", "expected"),
    [
        (
            "node-loss",
            {
                "fault_at": T0 + 8.0,
                "node": "n0",
                "node_down_at": T0 + 8.0,
                "lost_replica_names": ["r0"],
                "lb_ejected_at": {"r0": T0 + 9.2},
                "rescheduled": {"r0": {"t": T0 + 11.0, "from_node": "n0", "to_node": "n3"}},
                "replica_ready_at": {"r0": T0 + 12.3},
                "lb_up_at": {"r0": T0 + 12.8},
                "replica_serving_at": {"r0": T0 + 16.0},
                "node_up_at": T0 + 27.0,
                "node_up_by": "rollback",
            },
            {"recovery_s": 3.0},
            [
                "node n0 down",
                "r0 ejected by HAProxy",
                "r0 rescheduled n0→n3",
                "P99 and errors back in baseline",
                "r0 ready",
                "r0 UP in HAProxy",
                "r0 serving again",
                "node n0 back (rollback)",
            ],
        ),
        (
            "network-jitter",
            {"replica": "r0", "fault_at": T0 + 8.0, "cleared_at": T0 + 28.0, "removed_by": "undo"},
            {},
            ["jitter on r0", "jitter off (undo)"],
        ),
        (
            "upstream-timeout",
            {"replica": "r0", "fault_at": T0 + 8.0, "ejected_at": T0 + 10.6,
             "lb_up_again_at": T0 + 24.0},
            {"first_failure_at": T0 + 13.0, "last_failure_at": T0 + 19.6},
            ["r0 frozen", "r0 ejected by HAProxy", "first client failure",
             "last failure (interruption ends)", "r0 UP in HAProxy again"],
        ),
        (
            "simultaneous-restarts",
            {
                "restarts": {
                    "r0": {"died_at": T0 + 8.0, "ready_at": T0 + 9.6, "serving_again_at": T0 + 9.8},
                    "r1": {"died_at": T0 + 8.0, "ready_at": T0 + 9.9, "serving_again_at": None},
                },
                "all_serving_at": None,
            },
            {},
            ["r0 died", "r1 died", "r0 ready", "r0 serving again", "r1 ready"],
        ),
        (
            "quota-cut",
            {"cut_done_at": T0 + 8.6, "stopped": ["r2"], "restored_ready_at": {"r2": T0 + 20.0}},
            {},
            ["cut done (r2 stopped)", "r2 ready again"],
        ),
    ],
)  # fmt: skip
def test_markers_of_each_drill(
    kind: str, ground: dict[str, Any], figures: dict[str, Any], expected: list[str]
) -> None:
    got = timeline_markers([{"kind": kind, "fault_at": T0 + 8.0}], [], ground, figures, T0, T0 + 40)
    parts = [part for _, label, _ in got for part in label.split("; ")]
    injected = kind_module(kind).LEDGER_LABELS[0]  # type: ignore[union-attr]
    assert sorted(parts) == sorted([injected, *expected])  # the fault log's fault_at + the kind's
    times = [t for t, _, _ in got]
    assert times == sorted(times)


# -- table cells -----------------------------------------------------------------------------


def test_fmt_cell_formats_nested_unix_times_relative_to_the_drill_start() -> None:
    t0 = T0 + 0.5
    restarts = {
        "r0": {"died_at": T0 + 8.4644, "cause": "signal:SIGKILL", "new_pid": 31357, "restart_s": 1.787},
    }  # fmt: skip
    assert fmt_cell(restarts, t0) == (
        "r0: {died_at: +7.964 s, cause: signal:SIGKILL, new_pid: 31357, restart_s: 1.787}"
    )
    assert fmt_cell({"r0": T0 + 2.0, "r1": None}, t0) == "r0: +1.500 s; r1: —"
    assert fmt_cell(T0 - 1.0, t0) == "-1.500 s"
    assert fmt_cell(12.5, t0) == "12.5" and fmt_cell(3, t0) == "3"  # durations, counts: as is
    assert fmt_cell("a|b", t0) == "a\\|b"  # Markdown table cell
    assert fmt_cell([f"id{i}" for i in range(12)], t0).endswith("id7, … (12 in all)")
    html = str(fmt_cell({"r0": {"t": T0 + 2.0}, "r1": {"t": T0 + 3.0}}, t0, html=True))
    assert html == (
        'r0: {t: <span title="2027-01-15 08:00:02.000Z">+1.500 s</span>}<br>'
        'r1: {t: <span title="2027-01-15 08:00:03.000Z">+2.500 s</span>}'
    )
    assert str(fmt_cell("<b>", t0, html=True)) == "&lt;b&gt;"
    assert fmt_cell(T0 + 2.0, None) == "2027-01-15 08:00:02.000Z"  # no drill start: absolute


def test_unix_time_reads_summary_times() -> None:
    assert unix_time("2027-01-15T08:00:00+00:00") == T0
    assert unix_time("2027-01-15T08:00:00Z") == T0
    assert unix_time(T0) == T0 and unix_time("") is None and unix_time(None) is None


# -- per-request P99 beside the attempt P99 ------------------------------------------------


def _attempt(rid: str, n: int, sent: float, end: float, ok: bool) -> dict[str, Any]:
    return {
        "request_id": rid,
        "attempt": n,
        "sent_at": T0 + sent,
        "end_at": T0 + end,
        "first_token_at": T0 + sent + 0.01 if ok else None,
        "ok": ok,
        "status": 200 if ok else None,
        "error_class": None if ok else "timeout_ttft",
    }


def test_request_p99_includes_the_retried_wait_that_the_attempt_p99_censors() -> None:
    # 98 requests answered in 0.5 s; 2 whose first attempt timed out at 2 s, retried: 0.5 s more
    recs = [_attempt(f"q{i}", 1, i * 0.1, i * 0.1 + 0.5, True) for i in range(98)]
    for rid, sent in (("slow1", 3.0), ("slow2", 5.0)):
        recs.append(_attempt(rid, 1, sent, sent + 2.0, False))
        recs.append(_attempt(rid, 2, sent + 2.0, sent + 2.5, True))
    fig = common_figures(recs, [])
    assert fig["p99_e2e_s"] == pytest.approx(0.5, rel=1e-3)  # the 2 timed-out attempts censored
    assert fig["p99_request_e2e_s"] == pytest.approx(2.5, rel=1e-3)  # first send to final end
    assert fig["request_availability"] == 1.0 and fig["availability"] == pytest.approx(100 / 102)
    line = _headline(fig)
    assert "p99_e2e_s=0.5 (attempts; failed ones censored)" in line
    assert "p99_request_e2e_s=2.5 (per request, retries included)" in line
    # a failed attempt a retry served is not a lost request: the console says which is which
    assert f"availability={100 / 102:.3g} (attempts), request_availability=1 (per request" in line
    # without retries: no second P99 and no labels
    plain = common_figures(recs[:98], [])
    assert "p99_request_e2e_s" not in plain and "censored)" not in _headline(plain)
    assert "(attempts)" not in _headline(plain) and "request_availability" not in _headline(plain)


# -- upstream-timeout interruption ---------------------------------------------------------


def _upstream_records() -> list[dict[str, Any]]:
    """Freeze at 8 s; 4 requests sent to the frozen replica at 7.5-9.6 s hang until the client
    gives up (5 s idle / 10 s first-token timeouts); everything else answers in 0.4 s."""
    recs = [
        _attempt(f"ok{i}", 1, i * 0.25, i * 0.25 + 0.4, True)
        for i in range(100)  # 0 .. 25 s
    ]
    for rid, sent, end in (("h1", 7.5, 12.9), ("h2", 7.98, 17.98), ("h3", 9.37, 19.37),
                           ("h4", 9.64, 19.64)):  # fmt: skip
        recs.append(_attempt(rid, 1, sent, end, False))
    return recs


def test_upstream_interruption_counts_failures_still_pending_in_the_settling_window() -> None:
    recs = _upstream_records()
    fault_at = T0 + 8.0
    # one computation for every drill (issue 11): the shared definition counts the failures
    # still pending too, where it once read the first failure as "settled" and gave 0
    common = mfig.interruption(recs, fault_at, settle_s=5.0)
    got = upstream_timeout.interruption(recs, fault_at, settle_s=5.0)
    assert common == got
    # h2..h4 were in flight in the window after h1: the interruption runs to the last of them
    assert got["first_failure_at"] == T0 + 12.9 and got["last_failure_at"] == T0 + 19.64
    assert got["interruption_s"] == pytest.approx(19.64 - 12.9)
    assert got["failed_requests"] == 4
    assert got["sustained"] is True  # successes until 25.4 s: 5 s clean after 19.64 s


def test_upstream_interruption_stops_at_a_settled_window() -> None:
    recs = _upstream_records()
    # a request sent at 30 s that fails at 31 s is a new episode: it is not in flight in the
    # window after the hung ones, so it does not stretch the first one; it counts on its own
    recs += [_attempt(f"late{i}", 1, 25.0 + i * 0.25, 25.4 + i * 0.25, True) for i in range(40)]
    recs.append(_attempt("new", 1, 30.0, 31.0, False))
    got = upstream_timeout.interruption(recs, T0 + 8.0, settle_s=5.0)
    first = upstream_timeout.interruption(recs[:-1], T0 + 8.0, settle_s=5.0)
    assert first["last_failure_at"] == T0 + 19.64 and first["failed_requests"] == 4
    assert got["interruption_s"] == pytest.approx(first["interruption_s"])  # + 0 s
    assert got["episodes"] == 2 and got["failed_requests"] == 5
    assert got["episode_spans"][0][1] == pytest.approx(19.64 - 8.0)
    assert got["last_failure_at"] == T0 + 31.0
    # no failure at all: 0 and settled; data ending inside the window: not settled
    assert upstream_timeout.interruption(recs[:100], T0 + 8.0)["interruption_s"] == 0.0
    short = [r for r in _upstream_records() if r["end_at"] <= T0 + 21.0]
    cut = upstream_timeout.interruption(short, T0 + 8.0)
    assert cut["sustained"] is False and cut["last_failure_at"] == T0 + 19.64


# -- plots of a drill: the replica count left out off the lab -------------------------------


def _drill_dir(tmp_path: Path) -> tuple[Path, list[dict[str, Any]]]:
    d = tmp_path / "oom-kill"
    d.mkdir()
    (d / "faults.jsonl").write_text(
        json.dumps({"kind": "oom-kill", "fault_at": T0 + 10.0, "replica": "r1"}) + "\n"
    )
    recs = [_attempt(f"q{i}", 1, i * 0.2, i * 0.2 + 0.4, True) for i in range(150)]
    for r, i in zip(recs, range(150), strict=True):
        r["replica"] = f"r{i % 3}"
    return d, recs


def test_drill_plots_lab_has_replica_count_url_target_says_why_not(tmp_path: Path) -> None:
    d, recs = _drill_dir(tmp_path)
    entry = {"figures": {}, "ground_truth": {"replica": "r1", "replica_died_at": T0 + 10.0}}
    lab = {"kind": "lab", "replicas": 3}
    plots, omitted = drill_plots("oom-kill", d, recs, _life(), entry, lab, T0, T0 + 32.0)
    assert [p.name for p, _ in plots] == [
        "timeline.png", "latency_cdf.png", "replica_share.png", "replica_count.png",
    ]  # fmt: skip
    assert omitted == [] and (d / "replica_count.png").stat().st_size > 10_000

    url = {"kind": "url", "replicas": 0, "url": "http://127.0.0.1:9"}
    plots, omitted = drill_plots("oom-kill", d, recs, [], entry, url, T0, T0 + 32.0)
    assert [p.name for p, _ in plots] == ["timeline.png", "latency_cdf.png", "replica_share.png"]
    assert len(omitted) == 1 and omitted[0][0].startswith("Replica count over time")
    assert "not the local lab (target kind: url)" in omitted[0][1]
    assert not (d / "replica_count.png").exists()  # the lab run's PNG is not left to mislead
    entry["name"], entry["status"], entry["hypothesis"] = "oom-kill", "passed", {}
    md, html = render_drill(d, entry, url, "t", {"before": [], "after": []}, [], plots, omitted, T0)
    assert "_Omitted: the target is not the local lab (target kind: url)" in md.read_text()
    assert "omitted: the target is not the local lab" in html.read_text()
    assert "| replica_died_at | +10.000 s |" in md.read_text()


# -- recorder: HAProxy state snapshots from a real HAProxy ----------------------------------


def test_lb_status_words() -> None:
    assert [lb_status(x) for x in ("UP", "UP 1/2", "DOWN 1/2", "MAINT", "no check", "")] == [
        "UP", "UP", "DOWN", "MAINT", "UP", "UNKNOWN",
    ]  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.lab
@pytest.mark.skipif(haproxy_missing() is not None, reason=haproxy_missing() or "")
def test_recorder_writes_lb_state_snapshots_on_change(tmp_path: Path) -> None:
    haproxy = find_haproxy()
    assert haproxy is not None
    engine_port, front_port = _free_port(), _free_port()
    (tmp_path / "lab.json").write_text(
        json.dumps(
            {
                "health_path": "/health",
                "cgroup_version": 1,
                "replicas": [{"name": "r0", "port": engine_port, "cgroup": str(tmp_path / "cg")}],
            }
        )
    )
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(
        f"global\n    stats socket {tmp_path / 'haproxy.sock'} mode 600 level admin\n"
        "defaults\n    mode http\n    timeout connect 1s\n    timeout client 5s\n"
        "    timeout server 5s\n    timeout check 500ms\n"
        f"frontend fe\n    bind 127.0.0.1:{front_port}\n    default_backend engines\n"
        "backend engines\n    option httpchk GET /health\n"
        "    default-server inter 100ms fall 2 rise 2\n"
        f"    server r0 127.0.0.1:{engine_port} check\n"
    )
    rec = Recorder(tmp_path)
    assert rec.sample_lb_once() is False  # no HAProxy yet: nothing written, no error
    proc = subprocess.Popen([haproxy, "-db", "-f", str(cfg)], stderr=subprocess.DEVNULL)
    server: http.server.HTTPServer | None = None
    try:

        def sample_until(status: str, timeout_s: float = 8.0) -> None:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                rec.sample_lb_once()
                if (rec.lb_servers or {}).get("r0") == status:
                    return
                time.sleep(0.05)
            raise AssertionError(f"r0 never {status}: {rec.lb_servers}")

        sample_until("DOWN")  # nothing listens on the engine port
        server = http.server.HTTPServer(("127.0.0.1", engine_port), _Health)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        t_up = time.time()
        sample_until("UP")
        for _ in range(5):  # no change: no new event
            rec.sample_lb_once()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        if server is not None:
            server.shutdown()
            server.server_close()
    events = read_events(tmp_path / "events.jsonl")
    assert events and all(e["event"] == "lb_state" and e["replica"] is None for e in events)
    states = [e["servers"]["r0"] for e in events]
    assert all(a != b for a, b in zip(states, states[1:], strict=False))  # only on change
    assert "DOWN" in states and states[-1] == "UP"
    assert events[-1]["t"] >= t_up  # HAProxy marked it UP after it started answering
    assert [e["t"] for e in events] == sorted(e["t"] for e in events)
