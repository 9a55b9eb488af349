"""Locust as the drills' load (``chaoslib_infer.locust.control``): started headless with
``--processes``, its records in the run's ``records.jsonl``, a worker killed mid-run reported."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from chaoslib.exceptions import InterruptExecution
from labutil import write_locustfile as locustfile

from chaoslib_infer.load.fakeserver import FakeServer
from chaoslib_infer.load.records import read_records
from chaoslib_infer.locust import control

if importlib.util.find_spec("locust") is None:  # never import it here (gevent monkey-patching)
    pytest.skip("locust is not installed (extra 'locust')", allow_module_level=True)


@pytest.fixture(scope="module")
def server() -> Iterator[FakeServer]:
    with FakeServer(replica="lc") as srv:
        yield srv


def test_killed_worker_is_reported(server: FakeServer, tmp_path: Path) -> None:
    conf = {"infer_run_dir": str(tmp_path / "run"), "infer_base_url": server.url}
    out = control.start_locust(
        str(locustfile(tmp_path)), users=4, processes=2, warmup_s=2.5, max_duration_s=30,
        stop_timeout_s=1, configuration=conf,
    )  # fmt: skip
    try:
        assert out["engine"] == "locust" and "closed loop" in out["note"]
        run = control._RUNNING[str(Path(conf["infer_run_dir"]).resolve())]
        deadline = time.monotonic() + 5
        while len(run.workers) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(run.workers) == 2, run.workers
        records = tmp_path / "run" / "records.jsonl"
        while time.monotonic() < deadline + 10:  # both workers appending to the one file
            if len({r["request_id"][:8] for r in read_records(records)}) == 2:
                break
            time.sleep(0.2)
        victim = run.workers[0]
        os.kill(victim, signal.SIGKILL)
        time.sleep(1.5)
    finally:
        report = control.stop_locust(conf)
    assert report is not None
    assert [w["pid"] for w in report["workers_lost"]] == [victim]
    saved = json.loads((tmp_path / "run" / control.LOCUST_FILE).read_text())
    assert [w["pid"] for w in saved["workers_lost"]] == [victim] and saved[
        "note"
    ] == control.CO_NOTE
    assert saved["exit_code"] is not None and saved["processes"] == 2
    recs = read_records(tmp_path / "run" / "records.jsonl")
    cut = [r for r in recs if r["error_class"] == "cut_off"]  # on the wire at the stop
    recs = [r for r in recs if r["error_class"] != "cut_off"]
    assert len(recs) > 10 and all(r["ok"] for r in recs) and len(cut) <= 4
    assert len({r["request_id"][:8] for r in recs}) == 2  # both workers recorded (run id each)
    assert control.stop_locust(conf) is None  # idempotent


def test_bad_arguments_and_unreachable(tmp_path: Path) -> None:
    conf = {"infer_run_dir": str(tmp_path / "run"), "infer_base_url": "http://127.0.0.1:9"}
    with pytest.raises(InterruptExecution, match="locustfile .* not found"):
        control.start_locust(str(tmp_path / "nope.py"), configuration=conf)
    with pytest.raises(InterruptExecution, match="users must be an integer"):
        control.start_locust(str(locustfile(tmp_path)), users=0, configuration=conf)
    with pytest.raises(InterruptExecution, match="'locustfile' is required"):
        control.before_experiment_control({}, configuration=conf, users=2)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    conf["infer_base_url"] = f"http://127.0.0.1:{port}"
    with pytest.raises(InterruptExecution, match="no Locust request .* succeeded"):
        control.start_locust(
            str(locustfile(tmp_path)),
            users=1,
            warmup_s=2,
            startup_timeout_s=4,
            configuration=conf,
        )
    assert control._RUNNING == {}


def test_target_allowed_by_the_game_days_allow_is_not_refused(tmp_path: Path) -> None:
    """The game day's ``--allow`` reaches the control as ``infer_allow``: a target it allows is
    started (here Locust then exits at once on a bad flag), one it does not is refused."""
    conf = {"infer_run_dir": str(tmp_path / "run"), "infer_base_url": "http://10.1.2.3:8000"}
    lf = str(locustfile(tmp_path))
    with pytest.raises(InterruptExecution, match="outside the allowlist"):
        control.start_locust(lf, users=1, warmup_s=1, configuration=conf)
    conf["infer_allow"] = "http://10.1.2.3:8000"
    with pytest.raises(InterruptExecution, match="locust exited with code"):
        control.start_locust(
            lf, users=1, warmup_s=1, extra_args=["--no-such-locust-flag"], configuration=conf
        )
    assert control._RUNNING == {}
