"""Server-side /metrics parsing (vLLM, SGLang, TGI names) and the live scraper against the sim."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from chaoslib_infer.measure.scrape import (
    MetricsScraper,
    parse_metrics,
    read_samples,
    window_summary,
)

VLLM = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 7.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="m"} 0.25
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.99
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="m"} 2.0
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 4.0
vllm:time_to_first_token_seconds_count{model_name="m"} 4.0
vllm:time_to_first_token_seconds_sum{model_name="m"} 0.8
# TYPE vllm:request_success_total counter
vllm:request_success_total{finished_reason="stop",model_name="m"} 5.0
vllm:request_success_total{finished_reason="length",model_name="m"} 6.0
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{model_name="m"} 120.0
"""

SGLANG = """\
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m"} 2.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m"} 9.0
# TYPE sglang:e2e_request_latency_seconds histogram
sglang:e2e_request_latency_seconds_bucket{le="+Inf",model_name="m"} 2.0
sglang:e2e_request_latency_seconds_count{model_name="m"} 2.0
sglang:e2e_request_latency_seconds_sum{model_name="m"} 3.0
"""

TGI = """\
# TYPE tgi_queue_size gauge
tgi_queue_size 4
# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 8
# TYPE tgi_request_queue_duration histogram
tgi_request_queue_duration_bucket{le="+Inf"} 10
tgi_request_queue_duration_sum 0.5
tgi_request_queue_duration_count 10
# TYPE tgi_request_generated_tokens histogram
tgi_request_generated_tokens_bucket{le="+Inf"} 10
tgi_request_generated_tokens_sum 320
tgi_request_generated_tokens_count 10
# TYPE tgi_request_success counter
tgi_request_success 10
"""


def test_parse_vllm() -> None:
    v = parse_metrics(VLLM)
    assert v["running"] == 3 and v["waiting"] == 7
    assert v["kv_usage"] == 0.25  # the newer name wins over gpu_cache_usage_perc
    assert (v["ttft_sum"], v["ttft_count"]) == (0.8, 4)
    assert v["requests_done"] == 11 and v["generation_tokens"] == 120


def test_parse_sglang_and_tgi() -> None:
    s = parse_metrics(SGLANG)
    assert (s["running"], s["waiting"], s["e2e_sum"], s["e2e_count"]) == (2, 9, 3, 2)
    t = parse_metrics(TGI)
    assert (t["running"], t["waiting"]) == (8, 4)
    assert (t["queue_time_sum"], t["queue_time_count"]) == (0.5, 10)
    assert t["generation_tokens"] == 320 and t["requests_done"] == 10


def test_window_summary_deltas() -> None:
    rows = [
        {"t": 1.0, "url": "u", "ok": True, "values": {"ttft_sum": 1.0, "ttft_count": 10, "waiting": 2}},
        {"t": 1.5, "url": "u", "ok": False, "error": "x"},
        {"t": 2.0, "url": "u", "ok": True, "values": {"ttft_sum": 3.0, "ttft_count": 20, "waiting": 5}},
    ]  # fmt: skip
    w = window_summary(rows)
    assert w["mean_ttft_s"] == pytest.approx(0.2)
    assert (w["samples"], w["failed"], w["max_waiting"]) == (3, 1, 5)
    assert w["max_gap_s"] == pytest.approx(1.0)
    assert w["mean_e2e_s"] is None


async def _metrics_handler(_request: object) -> object:
    from aiohttp import web

    return web.Response(text=VLLM)


def test_scraper_polls_at_least_once_per_second(tmp_path: Path) -> None:
    from aiohttp import web

    async def main() -> None:
        app = web.Application()
        app.router.add_get("/metrics", _metrics_handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        bad = "http://127.0.0.1:9/metrics"  # discard port: refused
        try:
            async with MetricsScraper(
                [f"http://127.0.0.1:{port}/metrics", bad], tmp_path / "m.jsonl", 0.2
            ):
                await asyncio.sleep(1.1)
        finally:
            await runner.cleanup()

    asyncio.run(main())
    rows = read_samples(tmp_path / "m.jsonl")
    good = [r for r in rows if r["ok"]]
    assert len(good) >= 5 and all(r["values"]["running"] == 3 for r in good)
    assert sum(1 for r in rows if not r["ok"]) >= 5
    assert window_summary(rows)["max_gap_s"] < 1.0
