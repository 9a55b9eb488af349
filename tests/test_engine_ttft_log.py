"""The engine's ``--ttft-log``: one line per first token, keyed by request id (server-side TTFT)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from chaoslib_infer.lab.engine import EngineConfig, build_app, parse_args

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    """Run async tests on asyncio only."""
    return "asyncio"


async def test_ttft_log_one_line_per_first_token(tmp_path: Path) -> None:
    log = tmp_path / "ttft.jsonl"
    cfg = EngineConfig(
        load_delay_s=0.0, warmup_requests=0, itl_s=0.001, prefill_s_per_token=0.002,
        ttft_log=log,
    )  # fmt: skip
    app = build_app(cfg)
    body = {"model": "m", "messages": [{"role": "user", "content": "x" * 200}], "max_tokens": 3}
    t0 = time.time()
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://engine"
    ) as c:
        for i in range(3):
            r = await c.post(
                "/v1/chat/completions", json={**body, "stream": i != 1},
                headers={"X-Request-Id": f"T{i}"},
            )  # fmt: skip
            assert r.status_code == 200
        bad = await c.post("/v1/chat/completions", json={**body, "max_tokens": 0})
        assert bad.status_code == 400  # refused: no generation, no line
    app.state.engine.close()
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert [x["request_id"] for x in lines] == ["T0", "T1", "T2"]
    for x in lines:
        # 50 prompt tokens x 2 ms prefill: the server-side TTFT includes the prefill
        assert 0.1 <= x["ttft_s"] < 2.0
        assert t0 <= x["t"] <= time.time()


def test_ttft_log_flag() -> None:
    assert parse_args([]).ttft_log is None
    assert parse_args(["--ttft-log", "/tmp/x.jsonl"]).ttft_log == Path("/tmp/x.jsonl")
