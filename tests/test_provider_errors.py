"""The ``http_error`` engine fault mode (issue 23 item 4): the HTTP errors providers answer, in
each profile's shape, with ``Retry-After``, a probability and a burst length; ground truth in the
engine ledger. In process (ASGI), no sockets."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from chaoslib_infer.lab.engine import EngineConfig, RequestError, build_app, parse_fault
from chaoslib_infer.lab.engine.faults import FaultBoard, parse_fault_header
from chaoslib_infer.load.attempts import http_error_class
from chaoslib_infer.providers import get_profile, parse_error

BODY = {"model": "sim", "messages": [{"role": "user", "content": "hi"}], "stream": True,
        "max_tokens": 4}  # fmt: skip


def _run(
    fault: dict[str, Any], n: int, tmp_path: Path, profile: str | None = None
) -> list[httpx.Response]:
    """Arm ``fault`` on an in-process engine and send ``n`` chat requests; their responses."""
    config = EngineConfig(
        load_delay_s=0.0, warmup_requests=0, itl_s=0.0, ledger=tmp_path / "ledger.jsonl", model="sim",
        profile=profile,
    )  # fmt: skip
    app = build_app(config)
    out: list[httpx.Response] = []

    async def main() -> None:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://e"
        ) as c:
            r = await c.post("/admin/faults", json=fault)
            assert r.status_code == 200, r.text
            path = "/api/v3/chat/completions" if profile == "ark" else "/v1/chat/completions"
            for i in range(n):
                out.append(await c.post(path, json=BODY, headers={"X-Request-Id": f"r{i}"}))
        app.state.engine.close()

    asyncio.run(main())
    return out


def _ledger(tmp_path: Path) -> list[dict[str, Any]]:
    lines = (tmp_path / "ledger.jsonl").read_text().splitlines()
    return [json.loads(x) for x in lines if x.strip()]


@pytest.mark.parametrize(
    ("how", "status", "retry_after", "ark_code", "retryable"),
    [
        ("rate_limit", 429, "3", "RateLimitExceeded.EndpointRPMExceeded", True),
        ("unavailable", 503, "3", "ServiceUnavailable", True),
        ("server_error", 500, None, "InternalServiceError", True),
        ("closed_endpoint", 400, None, "InvalidEndpoint.ClosedEndpoint", True),
        ("bad_request", 400, None, "InvalidParameter", False),
    ],
)
def test_each_answer_in_ark_shape_with_its_ledger_line(
    tmp_path: Path, how: str, status: int, retry_after: str | None, ark_code: str, retryable: bool
) -> None:
    [r] = _run({"mode": "http_error", "how": how, "retry_after": 3, "profile": "ark"}, 1, tmp_path)
    assert r.status_code == status
    assert r.headers.get("retry-after") == retry_after
    err = r.json()["error"]
    assert err["code"] == ark_code and set(err) == {"code", "message", "param", "type"}
    assert parse_error(r.content)["shape"] == "openai"
    assert "x-chaos-shaped" in r.headers  # the plain engine: no mimic strips the marker
    [line] = [x for x in _ledger(tmp_path) if x.get("event") == "fault"]
    assert line["request_id"] == "r0" and line["mode"] == "http_error"
    assert line["answer"] == {
        "status": status, "code": ark_code, "retryable": retryable,
        "retry_after_s": 3 if retry_after else None, "profile": "ark",
    }  # fmt: skip
    # never a generation: a retry of it is a new request, not a duplicate
    assert not [x for x in _ledger(tmp_path) if x.get("event") == "generation"]


@pytest.mark.parametrize(
    ("profile", "shape", "status"),
    [("vllm", "openai", 429), ("sglang", "flat", 429), ("tgi", "tgi", 429),
     ("trtllm", "detail", 429), ("openai", "openai", 429)],
)  # fmt: skip
def test_profile_shapes(tmp_path: Path, profile: str, shape: str, status: int) -> None:
    [r] = _run({"mode": "http_error", "profile": profile}, 1, tmp_path)
    assert r.status_code == status and r.headers["retry-after"] == "2"  # the defaults
    assert parse_error(r.content)["shape"] == shape
    if profile == "openai":
        assert r.json()["error"]["code"] == "rate_limit_exceeded"
        assert r.json()["error"]["type"] == "rate_limit_error"


def test_the_mimic_keeps_the_providers_shape(tmp_path: Path) -> None:
    """An engine run as Ark (``--profile ark``): the fault's default profile is the engine's,
    and the mimic middleware does not rewrite the code into its generic 400 one."""
    fault = {"mode": "http_error", "how": "closed_endpoint"}
    [r] = _run(fault, 1, tmp_path, profile="ark")
    assert r.status_code == 400 and r.json()["error"]["code"] == "InvalidEndpoint.ClosedEndpoint"
    assert "x-chaos-shaped" not in r.headers
    assert http_error_class(r.status_code) == "http_4xx"
    assert get_profile("ark").error_shape == parse_error(r.content)["shape"]


def test_retry_after_zero_sends_no_header(tmp_path: Path) -> None:
    [r] = _run({"mode": "http_error", "how": "unavailable", "retry_after": 0}, 1, tmp_path)
    assert r.status_code == 503 and "retry-after" not in r.headers


def test_probability_and_burst(tmp_path: Path) -> None:
    """Each winning roll answers ``burst`` requests in a row; the rest are served."""
    fault = {"mode": "http_error", "probability": 0.2, "burst": 4, "seed": 7}
    rs = _run(fault, 200, tmp_path)
    hit = [r.status_code == 429 for r in rs]
    runs: list[int] = []
    for h in hit:
        if h and runs and runs[-1] > 0:
            runs[-1] += 1
        elif h:
            runs.append(1)
        else:
            runs.append(0)
    bursts = [n for n in runs if n]
    assert bursts and all(n % 4 == 0 for n in bursts)  # back-to-back bursts add up
    # a roll is made only outside a burst: P(hit) = 4p / (1 + 3p) = 0.5 for p = 0.2
    assert 0.35 < sum(hit) / len(hit) < 0.65
    assert all(r.status_code == 200 for r, h in zip(rs, hit, strict=True) if not h)
    faulted = {x["request_id"] for x in _ledger(tmp_path) if x.get("event") == "fault"}
    assert faulted == {f"r{i}" for i, h in enumerate(hit) if h}


def test_board_burst_counts_without_rolling() -> None:
    board = FaultBoard()
    board.set(parse_fault({"mode": "http_error", "burst": 3}))
    picks = [board.pick(10) for _ in range(5)]
    assert all(p is not None for p in picks)
    spec = board.active()[0]
    assert spec.burst_left == 1  # 5 picks: a burst of 3, then 2 of the next


def test_parameters_are_checked() -> None:
    spec = parse_fault_header("http_error;how=closed_endpoint;profile=ARK;burst=2")
    assert spec.params == {"how": "closed_endpoint", "retry_after": 2, "burst": 2,
                           "profile": "ark"}  # fmt: skip
    for bad in (
        {"how": "teapot"},
        {"burst": 0},
        {"retry_after": -1},
        {"retry_after": 1.5},
        {"profile": "nope"},
    ):
        with pytest.raises(RequestError):
            parse_fault({"mode": "http_error", **bad})
