"""The Locust user (``chaoslib_infer.locust.user``) against the fake SSE server, run by Locust itself
(headless, in a subprocess: Locust monkey-patches its process with gevent).

* error classes: every case of the built-in client's error-class table gives the same class,
  status and record fields; retries are separate attempts with one request id; Locust sees one
  request event per attempt (its CSV stats and failures);
* the same offered load: Locust users (closed loop, ``constant_throughput``) and the built-in
  open-loop client at the same mean rate give records that agree within stated tolerances.
"""

from __future__ import annotations

import csv
import http.server
import importlib.util
import os
import stat
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from statistics import median

import pytest
from labutil import free_port as _closed_port

# never import locust here: it monkey-patches the test process with gevent
if importlib.util.find_spec("locust") is None:
    pytest.skip("locust is not installed (extra 'locust')", allow_module_level=True)

from test_load_client import CASES, check_types  # noqa: E402

from chaoslib_infer.load.client import LoadSpec, run_load_blocking  # noqa: E402
from chaoslib_infer.load.fakeserver import FakeServer  # noqa: E402
from chaoslib_infer.load.locuststats import write_locust_stats  # noqa: E402
from chaoslib_infer.load.records import read_records  # noqa: E402

# timing-sensitive: scripts/quickstart test runs it alone, after the parallel pass
pytestmark = [pytest.mark.serial]


@pytest.fixture(scope="module")
def server() -> Iterator[FakeServer]:
    with FakeServer(replica="fl") as srv:
        yield srv


def run_locust(
    locustfile: Path, host: str | None, users: int, run_s: int, cwd: Path, *extra: str
) -> subprocess.CompletedProcess[str]:
    """Run Locust headless (bounded: ``run_s`` plus a stop timeout, killed after 60 s);
    ``host`` None keeps each user class's own ``host`` (``--host`` overrides them all)."""
    cmd = [
        sys.executable, "-m", "locust", "-f", str(locustfile), "--headless", "-u", str(users),
        "-r", str(users), "-t", f"{run_s}s", "--stop-timeout", "3",
        "--csv", str(cwd / "locust"), "--only-summary", "--loglevel", "WARNING", *extra,
    ]  # fmt: skip
    if host is not None:
        cmd += ["--host", host]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


def _stats(path: Path) -> dict[str, dict[str, str]]:
    with path.open(newline="") as fh:
        return {f"{r['Type']} {r['Name']}": r for r in csv.DictReader(fh)}


def test_error_classes_match_builtin_client(server: FakeServer, tmp_path: Path) -> None:
    cases = [*CASES, ("mode=hang", None, 200), ("mode=ok,tokens=6,itl=0.005", None, 200)]
    classes = []
    for i, (path, _, _) in enumerate(cases):
        classes.append(
            textwrap.dedent(f"""
            class Case{i}(LLMStreamUser):
                host = {server.url + "/" + path!r}
                records_path = {str(tmp_path / f"case{i}.jsonl")!r}
                fixed_count = 1
            """)
        )
    refused = f"http://127.0.0.1:{_closed_port()}"
    lf = tmp_path / "errors_locustfile.py"
    lf.write_text(
        textwrap.dedent(f"""
        from locust import constant
        from chaoslib_infer.load.client import DEFAULT_RETRY_ON
        from chaoslib_infer.locust.user import LLMStreamUser

        class Base(LLMStreamUser):
            abstract = True
            wait_time = constant(30)
            ttft_timeout_s = 0.4
            idle_timeout_s = 0.3
            timeout_s = 0.8

        LLMStreamUser = Base

        class Refused(Base):
            host = {refused!r}
            records_path = {str(tmp_path / "refused.jsonl")!r}
            fixed_count = 1

        class Retried(Base):
            host = {server.url + "/mode=http,status=503,fail=1"!r}
            records_path = {str(tmp_path / "retried.jsonl")!r}
            fixed_count = 1
            retry_attempts = 3
            retry_backoff_s = 0.05
        """)
        + "".join(classes)
    )
    n = len(cases) + 2
    res = run_locust(lf, None, n, 3, tmp_path)
    assert res.returncode in (0, 1), res.stderr[-3000:]  # 1: Locust saw failures, as it should
    for i, (path, expected, status) in enumerate(cases):
        recs = read_records(tmp_path / f"case{i}.jsonl")
        assert len(recs) == 1, (path, res.stderr[-2000:])
        r = recs[0]
        check_types(r)
        assert (r["error_class"], r["status"]) == (expected, status), (path, r["error"])
        assert r["attempt"] == 1 and r["final"] is True
        if expected is None:
            assert r["ok"] and r["replica"] == "fl" and r["end_at"] - r["sent_at"] < 0.6
        elif expected.startswith("timeout_"):
            limit = {"timeout_ttft": 0.4, "timeout_idle": 0.3, "timeout_total": 0.8}[expected]
            assert limit * 0.95 <= r["end_at"] - r["sent_at"] < 0.8 + 0.5, path
    ok = read_records(tmp_path / f"case{len(cases) - 1}.jsonl")[0]
    assert len(ok["chunk_times"]) == 6 and ok["output_tokens"] == 6
    assert ok["tokens_source"] == "usage" and ok["first_token_at"] == ok["chunk_times"][0]
    assert ok["chunk_times"][-1] - ok["chunk_times"][0] > 0.02  # times of arrival, not of the end
    (refused_rec,) = read_records(tmp_path / "refused.jsonl")
    assert refused_rec["error_class"] == "connect" and refused_rec["status"] is None
    retried = read_records(tmp_path / "retried.jsonl")
    assert [(r["attempt"], r["final"], r["error_class"]) for r in retried] == [
        (1, False, "http_5xx"),
        (2, True, None),
    ]
    assert retried[0]["request_id"] == retried[1]["request_id"]
    assert server.request_ids.count(retried[0]["request_id"]) == 2  # sent in X-Request-Id
    assert retried[1]["intended_at"] >= retried[0]["end_at"] + 0.05 * 0.8 - 1e-3
    # Locust's own stats: one request event per attempt, failures named by error class
    stats = _stats(tmp_path / "locust_stats.csv")
    agg = stats[" Aggregated"]
    assert int(agg["Request Count"]) == n + 1  # every case once, plus the retry
    with (tmp_path / "locust_failures.csv").open(newline="") as fh:
        errors = [row["Error"] for row in csv.DictReader(fh)]
    assert any(e.startswith("CatchResponseError('http_5xx: HTTP 503") for e in errors), errors
    assert any("timeout_idle: no output for 0.3 s" in e for e in errors), errors
    assert any("connect:" in e for e in errors), errors


def _p50(values: list[float]) -> float:
    return median(values)


def test_same_offered_load_as_builtin_client(server: FakeServer, tmp_path: Path) -> None:
    """Tolerances: sent rate within 25 % of the offered 20 req/s; every attempt ok;
    per-record shape identical (8 chunks, 8 usage tokens); P50 ITL within 2 ms, P50 TTFT within
    6 ms and P50 E2E within 10 % + 8 ms of the built-in client's. Locust's request path
    (geventhttpclient, cookie jar, request hooks) adds about 1-5 ms before the response headers
    on this 2-core machine, which is what the TTFT and E2E margins allow for; the chunk timing
    after the headers is the same (the fake server's 10 ms ITL)."""
    url = server.url + "/mode=ok,tokens=8,itl=0.01"
    lf = tmp_path / "same_load_locustfile.py"
    lf.write_text(
        textwrap.dedent(f"""
        from locust import constant_throughput
        from chaoslib_infer.locust.user import LLMStreamUser

        class Chat(LLMStreamUser):
            wait_time = constant_throughput(5)
            max_tokens = 8
            records_path = {str(tmp_path / "locust.jsonl")!r}
        """)
    )
    res = run_locust(lf, url, 4, 3, tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    # attempts still running when Locust stops are recorded as cut off: not part of the comparison
    ours = [r for r in read_records(tmp_path / "locust.jsonl") if not r.get("cut_off")]
    summary = run_load_blocking(
        LoadSpec(url=url, rate_rps=20, duration_s=3, max_tokens=8, seed=1), tmp_path / "b.jsonl"
    )
    base = [r for r in read_records(tmp_path / "b.jsonl") if not r.get("cut_off")]
    assert summary["failed"] == 0 and base
    for recs in (ours, base):  # offered rate over the sending span (Locust's start-up aside)
        span = max(r["sent_at"] for r in recs) - min(r["sent_at"] for r in recs)
        assert len(recs) >= 30 and 15 <= (len(recs) - 1) / span <= 25, (len(recs), span)
        assert all(r["ok"] and len(r["chunk_times"]) == 8 and r["output_tokens"] == 8 for r in recs)
        assert len({r["request_id"] for r in recs}) == len(recs)

    def figures(recs: list[dict]) -> tuple[float, float, float]:
        ttft = [r["first_token_at"] - r["sent_at"] for r in recs]
        e2e = [r["end_at"] - r["sent_at"] for r in recs]
        itl = [
            b - a
            for r in recs
            for a, b in zip(r["chunk_times"], r["chunk_times"][1:], strict=False)
        ]
        return _p50(ttft), _p50(itl), _p50(e2e)

    (t1, i1, e1), (t0, i0, e0) = figures(ours), figures(base)
    assert abs(t1 - t0) < 0.006, (t1, t0)
    assert abs(i1 - i0) < 0.002, (i1, i0)
    assert abs(e1 - e0) < 0.1 * e0 + 0.008, (e1, e0)
    # Locust counted the same attempts: its final printed summary (its CSV is rewritten only
    # every few seconds, so it may miss the last ones on a loaded machine)
    line = next(
        ln for ln in (res.stdout + res.stderr).splitlines() if ln.strip().startswith("Aggregated")
    )
    assert int(line.split()[1]) == len(ours), line
    agg = _stats(tmp_path / "locust_stats.csv")[" Aggregated"]
    assert 0 < int(agg["Request Count"]) <= len(ours)
    assert int(agg["Failure Count"]) == 0
    assert abs(float(agg["Median Response Time"]) / 1000 - e1) < 0.015
    # our Locust-format CSV from the same records reads like Locust's own
    ours_csv = _stats(write_locust_stats(tmp_path / "locust.jsonl")["stats"])[" Aggregated"]
    assert int(ours_csv["Request Count"]) == len(ours) >= int(agg["Request Count"])
    assert abs(int(ours_csv["50%"]) - int(agg["50%"])) <= 0.1 * int(agg["50%"]) + 10
    assert ours_csv["TTFT 50%"] != "N/A" and ours_csv["ITL 50%"] in ("10", "11", "12")


@pytest.mark.parametrize("example", ["subclass.py", "wrapped.py", "chat.py"])
def test_examples_record_a_team_locustfile(
    server: FakeServer, tmp_path: Path, example: str
) -> None:
    lf = Path(__file__).resolve().parents[1] / "examples" / "locust" / example
    res = run_locust(lf, server.url + "/mode=ok,tokens=5", 2, 2, tmp_path, "--chaos-records",
                     str(tmp_path / "records.jsonl"))  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    recs = [r for r in read_records(tmp_path / "records.jsonl") if r["error_class"] != "cut_off"]
    assert recs and all(r["ok"] and r["output_tokens"] == 5 for r in recs)
    for r in recs:
        check_types(r)
    agg = _stats(tmp_path / "locust_stats.csv")[" Aggregated"]
    assert int(agg["Failure Count"]) == 0  # the team's own content check passed on the replay
    if example != "chat.py":  # the team's bodies went out as they were (prompts, max_tokens)
        assert any("KV cache" in p or "printing press" in p or "hello" in p for p in server.prompts)


def test_attempts_cut_at_stop_are_recorded_cut_off(server: FakeServer, tmp_path: Path) -> None:
    lf = tmp_path / "slow_locustfile.py"
    lf.write_text(
        textwrap.dedent(f"""
        from chaoslib_infer.locust.user import LLMStreamUser

        class Slow(LLMStreamUser):
            records_path = {str(tmp_path / "slow.jsonl")!r}
            idle_timeout_s = None
        """)
    )
    cmd_host = server.url + "/mode=ok,tokens=50,itl=0.2"  # 10 s per reply: cut at the stop
    res = run_locust(lf, cmd_host, 2, 2, tmp_path, "--stop-timeout", "0")
    assert res.returncode in (0, 1), res.stderr[-3000:]
    recs = read_records(tmp_path / "slow.jsonl")
    assert len(recs) == 2 and all(r["error_class"] == "cut_off" for r in recs), recs
    assert all(r["cut_off"] and 0 < r["in_flight_s"] < 4 for r in recs)


_KEY = "sk-leak/7Hq+9&Zr<x>Pw2=Tm4"


class _EchoKey(http.server.BaseHTTPRequestHandler):
    """Echoes the ``Authorization`` key: ``/err/...`` in a 500 body 5 characters before the
    200-character cut, ``/rep/...`` in the ``X-Replica-Id`` header of a good stream."""

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        key = (self.headers.get("Authorization") or "").removeprefix("Bearer ")
        if self.path.startswith("/err/"):
            status, ctype, body = 500, "application/json", f"{'x' * 195}{key} bad key"
        else:  # a good stream
            chunk = (
                '{"choices": [{"index": 0, "delta": {"content": "tok"}, "finish_reason": null}]}'
            )
            status, ctype, body = 200, "text/event-stream", f"data: {chunk}\n\ndata: [DONE]\n\n"
        head = (
            f"HTTP/1.1 {status} X\r\nContent-Type: {ctype}\r\nX-Replica-Id: {key}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        self.wfile.write((head + body).encode())  # one write: the error body comes with its head

    def log_message(self, *args: object) -> None:
        return


def test_echoed_key_is_scrubbed_before_the_cut_and_records_are_private(tmp_path: Path) -> None:
    """Issue 13 on the Locust path: the error body is scrubbed, then cut (no 5-character prefix
    of the key left by a cut-then-scrub), the replica header is scrubbed, Locust's failure text
    too, and the records file is created 0600."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _EchoKey)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    lf = tmp_path / "echo_locustfile.py"
    lf.write_text(
        textwrap.dedent(f"""
        from locust import constant
        from chaoslib_infer.locust.user import LLMStreamUser

        class Err(LLMStreamUser):
            host = {url + "/err"!r}
            wait_time = constant(30)
            fixed_count = 1

        class Rep(LLMStreamUser):
            host = {url + "/rep"!r}
            wait_time = constant(30)
            fixed_count = 1
        """)
    )
    records = tmp_path / "records.jsonl"
    os.environ["CHAOS_INFER_API_KEY"] = _KEY
    try:
        res = run_locust(lf, None, 2, 2, tmp_path, "--chaos-records", str(records))
    finally:
        del os.environ["CHAOS_INFER_API_KEY"]
        srv.shutdown()
        srv.server_close()
    assert res.returncode in (0, 1), res.stderr[-3000:]
    assert stat.S_IMODE(records.stat().st_mode) == 0o600
    recs = read_records(records)
    assert len(recs) == 2 and all(r["replica"] == "[REDACTED]" for r in recs), recs
    (err,) = [r for r in recs if r["error_class"] == "http_5xx"]
    assert err["error"] == "HTTP 500: " + ("x" * 195 + "[REDACTED]")[:200]
    written = records.read_text() + (tmp_path / "locust_failures.csv").read_text()
    assert _KEY[:5] not in written and "[REDA" in written
