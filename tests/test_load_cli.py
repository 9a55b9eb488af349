"""``python -m chaoslib_infer.load`` end to end, signals and argument errors (subprocesses)."""

from __future__ import annotations

import csv
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from labutil import killed_at_exit, run_module

from chaoslib_infer.load.fakeserver import FakeServer
from chaoslib_infer.load.records import read_records

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def server() -> Iterator[FakeServer]:
    with FakeServer(replica="cli") as srv:
        yield srv


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "chaoslib_infer.load", *args]


def test_cli_end_to_end(server: FakeServer, tmp_path: Path) -> None:
    out = tmp_path / "rec.jsonl"
    proc = run_module(
        "chaoslib_infer.load",
        "--url",
        server.url + "/mode=ok,tokens=8,itl=0.002",
        "--rate",
        "30",
        "--duration-s",
        "3",
        "--out",
        str(out),
        "--max-tokens",
        "8",
        "--seed",
        "5",
        "--api",
        "completions",
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    recs = read_records(out)
    assert len(recs) == summary["records"] == summary["sent"] > 40
    assert all(r["ok"] and r["replica"] == "cli" for r in recs)
    assert "sent=" not in proc.stdout and proc.stderr.count("in_flight=") == 0  # <5 s: no line yet
    # Locust-format CSV stats beside the records, as a drill's
    stats = tmp_path / "rec_stats.csv"
    assert summary["locust_stats"]["stats"] == str(stats)
    with stats.open(newline="") as fh:
        agg = next(r for r in csv.DictReader(fh) if r["Name"] == "Aggregated")
    assert int(agg["Request Count"]) == len(recs) and agg["Failure Count"] == "0"
    assert (tmp_path / "rec_stats_history.csv").is_file()
    assert (tmp_path / "rec_failures.csv").is_file()


def test_cli_progress_lines(server: FakeServer, tmp_path: Path) -> None:
    proc = run_module(
        "chaoslib_infer.load",
        "--url",
        server.url,
        "--rate",
        "20",
        "--duration-s",
        "1.2",
        "--out",
        str(tmp_path / "r.jsonl"),
        "--progress-s",
        "0.5",
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("load ")]
    assert len(lines) >= 2 and all("in_flight=" in ln and "failed=" in ln for ln in lines)


def _start_60s(url: str, rate: str, out: Path) -> subprocess.Popen[str]:
    """The load CLI in the background: ``rate`` requests/s to ``url`` for 60 s, records to
    ``out``."""
    return subprocess.Popen(
        cli("--url", url, "--rate", rate, "--duration-s", "60", "--out", str(out)),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_cli_signal_stops_cleanly(server: FakeServer, tmp_path: Path, sig: int) -> None:
    out = tmp_path / "rec.jsonl"
    # half the requests finish, half stall until cancelled
    proc = _start_60s(server.url + "/mode=ok,tokens=4", "50", out)
    with killed_at_exit(proc):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (not out.exists() or out.stat().st_size < 2000):
            time.sleep(0.05)
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=10)
    assert proc.returncode == 0, stderr
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["stopped"] is True
    recs = read_records(out)
    assert len(recs) == summary["records"] > 0
    assert out.read_bytes().endswith(b"\n")  # every finished record is complete on disk


def test_cli_signal_records_in_flight_as_cut_off(server: FakeServer, tmp_path: Path) -> None:
    out = tmp_path / "rec.jsonl"
    proc = _start_60s(server.url + "/mode=stall,k=1", "20", out)
    with killed_at_exit(proc):
        time.sleep(1.5)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=10)
    assert proc.returncode == 0, stderr
    summary = json.loads(stdout.strip().splitlines()[-1])
    # each attempt on the wire at the signal is recorded as cut off (outcome unknown), not dropped
    recs = read_records(out)
    assert summary["cancelled"] > 0 and summary["records"] == len(recs) == summary["cancelled"]
    assert all(r["cut_off"] and r["error_class"] == "cut_off" for r in recs)
    # and the in-flight snapshot beside the records is left empty
    assert json.loads((out.parent / "inflight.json").read_text())["attempts"] == []


@pytest.mark.parametrize(
    "args",
    [
        ["--rate", "1", "--duration-s", "1", "--out", "X"],
        ["--url", "nope", "--rate", "1", "--duration-s", "1", "--out", "X"],
        ["--url", "http://127.0.0.1:9", "--rate", "0", "--duration-s", "1", "--out", "X"],
        ["--url", "http://127.0.0.1:9", "--rate", "abc", "--duration-s", "1", "--out", "X"],
        [
            "--url",
            "http://127.0.0.1:9",
            "--rate",
            "1",
            "--duration-s",
            "1",
            "--out",
            "X",
            "--api",
            "embeddings",
        ],
        [
            "--url",
            "http://127.0.0.1:9",
            "--rate",
            "1",
            "--duration-s",
            "1",
            "--out",
            "/nonexistent-dir/x.jsonl",
        ],
    ],
)
def test_cli_bad_arguments(tmp_path: Path, args: list[str]) -> None:
    args = [str(tmp_path / "x.jsonl") if a == "X" else a for a in args]
    proc = run_module("chaoslib_infer.load", *args, timeout=30)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "error:" in lines[0], proc.stderr
