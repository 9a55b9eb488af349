"""Issue 13: a key the target echoes back never reaches a file or a printed line.

A small HTTP server echoes the ``Authorization`` key it receives, on purpose, wherever a server
might: across the 200-character cut of an error body, in a response header the load client keeps
(``X-Replica-Id``), in an SSE ``error`` event and in an error object inside a 200 stream (across
the 300-character cut), and as base64 (HTTP Basic), HTML entities and ``quote_plus`` text. A game
day runs one drill against it while a thread reads every file of the output folder every 20 ms;
no file ever holds any 8-character run of the key (in any of those forms), no printed line
either, and every file is private (0600, folders 0700).

The key starts 4 to 6 characters before each cut, so a text cut *before* it is scrubbed keeps
fewer than 8 characters of it, which the 8-character windows cannot see: every file and printed
line is also searched for the characters just before the key in each echo (the pad) followed by
the key's first 4 characters (:func:`_cut_needles`).
"""

from __future__ import annotations

import base64
import html
import http.server
import itertools
import os
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote_plus

import pytest
import yaml
from labutil import (
    QuietHandler,
    background_load_control,
    chaos_infer_argv,
    echo_key_probe,
    serve_http,
)

from chaoslib_infer.safety import redact

ROOT = Path(__file__).resolve().parent.parent
KEY = "sk-leak/7Hq+9&Zr<x>Pw2=Tm4"


def _needles(key: str) -> list[bytes]:
    """Every 8-character window of the key in each form the server echoes it."""
    forms = [key, html.escape(key), quote_plus(key, safe="")]
    out = {f[i : i + 8] for f in forms for i in range(len(f) - 7)}
    for prefix in ("user:", "u:", ":"):  # Basic auth at the three base64 alignments
        enc = base64.b64encode((prefix + key).encode()).decode()
        core = enc[len(prefix) * 4 // 3 + 2 : -4]
        out |= {core[i : i + 8] for i in range(len(core) - 7)}
    return sorted(o.encode() for o in out)


#: The 4 characters just before the key in each echo cut at 200/300 (see :func:`_echo`).
_PADS = ("xxxx", "yyyy", "key ")


def _cut_needles(key: str) -> list[bytes]:
    """What a cut-then-scrub bug leaves: a pad followed by the key's first 4 characters."""
    return [(pad + key[:4]).encode() for pad in _PADS]


def _echo(key: str, n: int) -> tuple[int, dict[str, str], bytes]:
    """Response number ``n`` (status, headers, body): one echo placement per case."""
    case = 5 if n % 2 == 0 else (n // 2) % 5  # every other reply a success (the warm-up needs one)
    pad = "x" * 195  # the key starts 5 characters before the 200-character cut
    if case == 0:  # error body across the cut
        return 500, {"Content-Type": "application/json"}, f"{pad}{key} bad key".encode()
    if case == 1:  # a header the client records, and a 401 with encoded forms
        basic = base64.b64encode(f"user:{key}".encode()).decode()
        body = f"{pad[:150]}Basic {basic} {html.escape(key)} {quote_plus(key, safe='')}"
        return 401, {"X-Replica-Id": key, "WWW-Authenticate": f"Basic {basic}"}, body.encode()
    if case == 2:  # SSE error event across the 300-character cut
        body = f"event: error\ndata: {'y' * 296}{key} tail\n\n"
        return 200, {"Content-Type": "text/event-stream"}, body.encode()
    if case == 3:  # error object inside a 200 stream
        msg = f"{'z' * 290}key {key} rejected"
        body = 'data: {"error": {"message": "' + msg + '"}}\n\ndata: [DONE]\n\n'
        return 200, {"Content-Type": "text/event-stream", "X-Replica-Id": key[:12]}, body.encode()
    if case == 4:  # not an SSE stream at all: the head of the body is quoted
        return 200, {"Content-Type": "text/plain"}, f"{key[3:]} {key}".encode()
    # a normal stream (the hypothesis sees some successes), the key only in the content
    chunk = '{"choices": [{"index": 0, "delta": {"content": "%s"}, "finish_reason": null}]}'
    last = '{"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}'
    events = [chunk % "tok", chunk % key.replace("<", "").replace(">", ""), last]
    body = "".join(f"data: {e}\n\n" for e in events) + "data: [DONE]\n\n"
    return 200, {"Content-Type": "text/event-stream", "X-Replica-Id": "r1"}, body.encode()


#: One response number per echo case of :func:`_echo` (a success, then cases 0 to 4).
_ONE_OF_EACH = (0, 1, 3, 5, 7, 9)
assert sorted({5 if n % 2 == 0 else (n // 2) % 5 for n in _ONE_OF_EACH}) == [0, 1, 2, 3, 4, 5]


class _Handler(QuietHandler):
    counter = itertools.count()
    keys_seen: list[str] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        auth = self.headers.get("Authorization") or ""
        key = auth.removeprefix("Bearer ")
        _Handler.keys_seen.append(key)
        status, headers, body = _echo(key, next(_Handler.counter))
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def echo_server() -> Iterator[str]:
    _Handler.keys_seen = []
    with serve_http(_Handler) as url:
        yield url


def test_needles_catch_what_a_cut_leaves() -> None:
    """The test's own detector: it sees a key cut at 200 characters (a prefix >= 8 chars)."""
    cut = (f"{'x' * 190}{KEY}")[:200].encode()
    assert any(n in cut for n in _needles(KEY))
    for n in _ONE_OF_EACH:  # each echo cut where the client cuts it, before scrubbing: seen
        status, _headers, body = _echo(KEY, n)
        text = body.decode()
        if status == 500:
            assert any(x in text[:200].encode() for x in _cut_needles(KEY))
            assert not any(x in text[:200].encode() for x in _needles(KEY))  # the blind spot
        elif "event: error" in text:
            data = text.split("data: ", 1)[1]
            assert any(x in data[:300].encode() for x in _cut_needles(KEY))
            assert not any(x in data[:300].encode() for x in _needles(KEY))
        elif '"error"' in text:
            msg = text.split('"message": "', 1)[1]
            assert any(x in msg[:300].encode() for x in _cut_needles(KEY))
            assert not any(x in msg[:300].encode() for x in _needles(KEY))
    basic = base64.b64encode(f"user:{KEY}".encode())
    assert any(n in basic for n in _needles(KEY))


@pytest.mark.parametrize("n", _ONE_OF_EACH)
def test_each_echo_case_is_scrubbed_in_memory(n: int) -> None:
    """Each echo placement, as text the client keeps, holds no 8-character run of the key."""
    _status, headers, body = _echo(KEY, n)
    text = " ".join([*headers.values(), body.decode()])
    clean = redact.redact_text(text, [KEY]).encode()
    assert [x for x in _needles(KEY) + _cut_needles(KEY) if x in clean] == []


@pytest.mark.parametrize("n", _ONE_OF_EACH)
def test_each_echo_case_is_scrubbed_before_the_client_cuts_it(
    n: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The load client's own error texts (HTTP error line, SSE error event, stream error
    object) of each echo hold no run of the key, the short prefix a cut leaves included."""
    from chaoslib_infer.load.attempts import http_error
    from chaoslib_infer.measure.sse import StreamParser

    monkeypatch.setenv(redact.API_KEY_ENV, KEY)
    status, _headers, body = _echo(KEY, n)
    if status >= 400:
        kept = http_error(status, body.decode())[1]
    else:
        parser = StreamParser()
        parser.feed(body)
        parser.close()
        kept = f"{parser.error} {parser.garbled} {parser.classify()}"
    assert [x for x in _needles(KEY) + _cut_needles(KEY) if x in kept.encode()] == [], kept


def _scan(out: Path, needles: list[bytes], leaks: list[str], modes: list[str]) -> None:
    for dirpath, dirnames, filenames in os.walk(out):
        for d in dirnames:
            st = os.lstat(Path(dirpath) / d)
            if stat.S_IMODE(st.st_mode) & 0o077:
                modes.append(f"{Path(dirpath) / d}: {oct(st.st_mode)}")
        for name in filenames:
            path = Path(dirpath) / name
            try:
                st = os.lstat(path)
                if not stat.S_ISREG(st.st_mode):
                    continue
                data = path.read_bytes()
            except OSError:
                continue  # renamed away between walk and read (atomic writes)
            if stat.S_IMODE(st.st_mode) & 0o077:
                modes.append(f"{path}: {oct(st.st_mode)}")
            for needle in needles:
                if needle in data:
                    leaks.append(f"{path.relative_to(out)}: {needle!r}")


def _watch(
    proc: subprocess.Popen[bytes],
    out: Path,
    needles: list[bytes],
    leaks: list[str],
    modes: list[str],
) -> tuple[int, bytes, bytes]:
    """Scan ``out`` every 20 ms while ``proc`` runs (150 s at most, then it is killed), once more
    at the end; returns the number of scans, stdout and stderr."""
    scans = 0
    deadline = time.monotonic() + 150
    while proc.poll() is None and time.monotonic() < deadline:
        _scan(out, needles, leaks, modes)
        scans += 1
        time.sleep(0.02)
    if proc.poll() is None:
        proc.kill()
    stdout, stderr = proc.communicate(timeout=30)
    _scan(out, needles, leaks, modes)
    return scans, stdout, stderr


def test_echoed_key_reaches_no_file_and_no_printed_line(tmp_path: Path, echo_server: str) -> None:
    exp = {
        "version": "1.0.0",
        "title": "secret echo",
        "description": "load against a server that echoes the key",
        "configuration": {
            "infer_run_dir": {"type": "env", "key": "CHAOS_INFER_RUN_DIR", "default": "x"},
            "infer_base_url": {"type": "env", "key": "CHAOS_INFER_BASE_URL", "default": ""},
            "infer_api_key": {"type": "env", "key": "CHAOS_INFER_API_KEY"},
        },
        "controls": [
            background_load_control(
                rate_rps=30, warmup_s=4, max_duration_s=60, max_tokens=4, timeout_s=3
            )
        ],
        "steady-state-hypothesis": {
            "title": "available",
            "probes": [
                {  # the figures (echoes fail most requests) are read, never judged here
                    "type": "probe",
                    "name": "availability-read",
                    "tolerance": {"type": "jsonpath", "path": "$.metric", "expect": "availability"},
                    "provider": {
                        "type": "python",
                        "module": "chaoslib_infer.activities.slo",
                        "func": "slo_check",
                        "arguments": {"metric": "availability", "window_s": 2},
                    },
                }
            ],
        },
        "method": [echo_key_probe(4)],  # the key reaches Chaos Toolkit's journal and log
        "rollbacks": [],
        "runtime": {"rollbacks": {"strategy": "always"}},
    }
    exp_path = tmp_path / "echo.yaml"
    exp_path.write_text(yaml.safe_dump(exp, sort_keys=False))
    plan = tmp_path / "plan.yaml"
    plan.write_text(f"name: secret-echo\ndrills:\n  - name: echo\n    experiment: {exp_path}\n")
    out = tmp_path / "out"
    env = {**os.environ, "CHAOS_INFER_API_KEY": KEY}
    proc = subprocess.Popen(
        chaos_infer_argv("gameday", str(plan), "--out", str(out), "--target", echo_server),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env=env,
    )
    needles = _needles(KEY) + _cut_needles(KEY)
    leaks: list[str] = []
    modes: list[str] = []
    scans, stdout, stderr = _watch(proc, out, needles, leaks, modes)
    assert proc.returncode in (0, 1, 3), (stdout + stderr).decode()[-3000:]
    assert scans > 20
    assert KEY in _Handler.keys_seen  # the key was sent and echoed
    assert len(_Handler.keys_seen) >= 50  # every echo case ran several times
    printed = stdout + stderr
    assert [n for n in needles if n in printed] == []
    assert sorted(set(leaks)) == [], "\n".join(sorted(set(leaks)))
    assert sorted(set(modes)) == []
    records = (out / "echo" / "records.jsonl").read_text()
    assert redact.REDACTED in records  # the echoes were recorded, scrubbed
    assert "HTTP 500: " + "x" * 50 in records


# ---- the redaction primitives ---------------------------------------------------------------
def test_clip_scrubs_before_cutting_and_substrings_go() -> None:
    text = "x" * 195 + KEY + " tail"
    assert KEY[:5] not in redact.redact_text(text, [KEY])[:200]
    assert text[:200].endswith(KEY[:5])  # what cutting first would have kept
    os.environ[redact.API_KEY_ENV] = KEY
    try:
        clipped = redact.clip(text, 200)
        assert clipped.endswith(redact.REDACTED[:5]) and "sk-le" not in clipped
        # a 9-character prefix left by someone else's cut, and an inner run, both go
        assert redact.scrub(f"a {KEY[:9]} b {KEY[5:14]} c") == "a [REDACTED] b [REDACTED] c"
        assert redact.scrub(f"a {KEY[:7]} b") == f"a {KEY[:7]} b"  # under 8: unrelated text
    finally:
        del os.environ[redact.API_KEY_ENV]


@pytest.mark.parametrize("prefix", ["", "u", "us", "user:", "Authorization: x"])
def test_base64_at_every_alignment(prefix: str) -> None:
    for enc in (base64.b64encode, base64.urlsafe_b64encode):
        blob = enc((prefix + KEY + "!").encode()).decode()
        clean = redact.redact_text(f"Basic {blob}", [KEY])
        assert redact.REDACTED in clean
        assert [n for n in _needles(KEY) if n in clean.encode()] == []


def test_html_entities_quote_plus_and_short_values() -> None:
    forms = [html.escape(KEY), quote_plus(KEY), quote_plus(KEY, safe=""),
             "".join(c if c.isalnum() else f"&#{ord(c)};" for c in KEY)]  # fmt: skip
    for form in forms:
        assert redact.redact_text(f"<p>{form}</p>", [KEY]) == "<p>[REDACTED]</p>", form
    assert redact.redact_text("pin abcd!", ["abcd"]) == "pin [REDACTED]!"  # short: whole only
    assert redact.known_secrets(["abcd", "abc"]) == ["abcd"]


def test_record_writer_scrubs_server_text_and_is_private(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from chaoslib_infer.load.records import RecordWriter, read_records

    monkeypatch.setenv(redact.API_KEY_ENV, KEY)
    out = tmp_path / "records.jsonl"
    with RecordWriter(out) as w:
        w.write({"request_id": "a", "error": f"HTTP 401: {KEY[:10]}", "replica": KEY})
        w.write({"request_id": "b", "error": None, "replica": "r1"})
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    recs = read_records(out)
    assert recs[0]["error"] == "HTTP 401: [REDACTED]" and recs[0]["replica"] == "[REDACTED]"
    assert recs[1]["replica"] == "r1"


def test_child_env_drops_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(redact.API_KEY_ENV, KEY)
    monkeypatch.setenv("MY_TOKEN", "tok-123456789")
    monkeypatch.setenv(redact.EXTRA_ENV, "MY_TOKEN")
    monkeypatch.setenv("CHAOS_INFER_ENGINE_API_KEY", "engine-key-123")
    env = redact.child_env()
    assert redact.API_KEY_ENV not in env and "MY_TOKEN" not in env
    assert env["CHAOS_INFER_ENGINE_API_KEY"] == "engine-key-123"  # the lab engine's own key
    assert env["PATH"] == os.environ["PATH"]


def test_private_dir(tmp_path: Path) -> None:
    d = redact.private_dir(tmp_path / "a" / "b")
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    os.chmod(d, 0o755)
    redact.private_dir(d)
    assert stat.S_IMODE(d.stat().st_mode) == 0o700


# ---- certification: the targets' keys (api_key_file, api_key_env) are scrubbed live ----------
KEY_B = "pk-cert/3Vb+8&Yq<w>Nd5=Rs7"  # a second target's key, from its api_key_env


class _CertHandler(_Handler):
    """The echo server as a provider: health and model routes answer, a request without a key
    gets 401 (the probe's 'key enforced' check), every other POST is an echo of :func:`_echo`."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = b'{"object": "list", "data": []}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        if not self.headers.get("Authorization"):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = b'{"error": {"message": "no key", "type": "invalid_request_error"}}'
            self.send_response(401)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)
            return
        super().do_POST()


def test_certification_keys_reach_no_file_at_any_moment(tmp_path: Path) -> None:
    """Two certification targets, one key from ``api_key_file``, one from ``api_key_env``
    (neither in ``$CHAOS_INFER_API_KEY``), against a provider that echoes the key it gets in
    error bodies, headers and streams: no file of the output folder holds a run of either key
    at any moment of the run (not only after the final scrub), nor any printed line."""
    _Handler.keys_seen = []
    _Handler.counter = itertools.count()
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _CertHandler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    keyfile = tmp_path / "a.key"
    keyfile.write_text(KEY + "\n")
    targets = []
    for name, source in (("a", {"api_key_file": str(keyfile)}), ("b", {"api_key_env": "CERT_B"})):
        path = tmp_path / f"{name}.yaml"
        doc = {"name": name, "profile": "openai", "url": url, "model": "m",
               "include_usage": False, **source}  # fmt: skip
        path.write_text(yaml.safe_dump(doc))
        targets += ["--target", str(path)]
    plan = tmp_path / "plan.yaml"
    phases = {p: {"enabled": p == "single"} for p in
              ("single", "ramp", "burst", "soak", "jitter", "timeouts")}  # fmt: skip
    phases["single"]["requests"] = 60
    plan.write_text(yaml.safe_dump({"request": {"max_tokens": 4, "timeout_s": 5.0},
                                    "slo": {"p95_over_p50": None}, "phases": phases}))  # fmt: skip
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k not in (redact.API_KEY_ENV, redact.EXTRA_ENV)}
    env["CERT_B"] = KEY_B
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "chaoslib_infer.cli", "certify", *targets, "--plan", str(plan),
             "--out", str(out)],  # fmt: skip
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, env=env,
        )  # fmt: skip
        needles = sorted(
            {*_needles(KEY), *_cut_needles(KEY), *_needles(KEY_B), *_cut_needles(KEY_B)}
        )
        leaks: list[str] = []
        modes: list[str] = []
        scans, stdout, stderr = _watch(proc, out, needles, leaks, modes)
    finally:
        srv.shutdown()
        srv.server_close()
    printed = stdout + stderr
    assert proc.returncode in (0, 1), printed.decode()[-3000:]
    assert scans > 20
    assert KEY in _Handler.keys_seen and KEY_B in _Handler.keys_seen  # both sent and echoed
    assert len(_Handler.keys_seen) >= 100
    assert [n for n in needles if n in printed] == [], printed.decode()[-3000:]
    assert sorted(set(leaks)) == [], "\n".join(sorted(set(leaks)))
    records = (out / "a" / "single" / "records.jsonl").read_text()
    assert redact.REDACTED in records  # the echoes were recorded, scrubbed
    assert "HTTP 500: " + "x" * 50 in records


def test_run_secrets_are_known_in_memory_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key registered for a run is scrubbed by scrub/clip/RecordWriter inside the block, is
    dropped from a child's environment, never enters os.environ, and is forgotten afterwards."""
    from chaoslib_infer.load.records import RecordWriter, read_records

    monkeypatch.delenv(redact.API_KEY_ENV, raising=False)
    monkeypatch.delenv(redact.EXTRA_ENV, raising=False)
    monkeypatch.setenv("CERT_B", KEY_B)
    text = "x" * 195 + KEY + " tail"
    assert redact.clip(text, 200).endswith(KEY[:5])  # unknown: nothing scrubbed
    before = dict(os.environ)
    with redact.run_secrets([KEY, KEY_B, None, "  "]) as vals:
        assert vals == sorted([KEY, KEY_B])
        assert dict(os.environ) == before  # nothing written to the environment
        assert redact.clip(text, 200) == "x" * 195 + redact.REDACTED[:5]
        assert redact.scrub(f"a {KEY_B[:9]} b") == "a [REDACTED] b"
        assert KEY in redact.known_secrets() and KEY_B in redact.known_secrets()
        assert "CERT_B" not in redact.child_env() and "PATH" in redact.child_env()
        with RecordWriter(tmp_path / "r.jsonl") as w:
            w.write({"request_id": "a", "error": f"HTTP 401: {KEY[:10]}", "replica": KEY_B})
        with redact.run_secrets([KEY]):  # nested: still known after the inner block
            pass
        assert redact.scrub(KEY) == redact.REDACTED
    rec = read_records(tmp_path / "r.jsonl")[0]
    assert rec["error"] == "HTTP 401: [REDACTED]" and rec["replica"] == redact.REDACTED
    assert redact.scrub(KEY) == KEY and KEY not in redact.known_secrets()  # forgotten
    assert redact.child_env()["CERT_B"] == KEY_B
