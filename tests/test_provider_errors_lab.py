"""Our client and the OpenAI SDK client meet a provider's 429s through the lab's HAProxy (issue 23
items 3 and 4): the ``http_error`` fault answers 30 % of arrivals with 429 ``Retry-After: 1`` on
every replica; each client's handling is measured against the engine ledger (ground truth:
``measure/retryafter.py``), never taken from the client's own records.

Found: the SDK (default policy, ``max_retries`` 2) waits the Retry-After before every retry; our
client with its default policy (``retry_after_max_s`` None) retries after its own 0.2 s backoff
and does not; with ``retry_after_max_s`` set it does. HAProxy passes a 429 through untouched (no
gateway retry): every arrival at the engine is one client attempt, for both clients.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from chaoslib_infer.activities import engine_faults as ef
from chaoslib_infer.evidence.figures import read_jsonl
from chaoslib_infer.lab.fleet import Lab
from chaoslib_infer.load.client import LoadSpec, run_load
from chaoslib_infer.load.records import RecordWriter, read_records
from chaoslib_infer.measure.retryafter import RETRY_AFTER_TOLERANCE_S, provider_error_figures

pytest.importorskip("openai")


def _load(spec: LoadSpec, out: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    async def main() -> dict[str, Any]:
        with RecordWriter(out) as w:
            return await run_load(spec, w)

    return asyncio.run(main()), read_records(out)


@pytest.mark.lab
@pytest.mark.slow
def test_our_client_and_the_sdk_meet_429s(tmp_path: Path) -> None:
    lab_dir = tmp_path / "lab"
    conf = {"infer_lab_dir": str(lab_dir), "infer_run_dir": str(tmp_path / "run")}
    lab = Lab.up(
        lab_dir,
        replicas=2,
        engine="sim",
        memory_limit_mb=256,
        engine_args={"load_delay_s": 0.3, "warmup_requests": 0, "itl_s": 0.005},
        ready_timeout_s=30,
    )
    try:
        ef.set_engine_fault(
            "http_error", replica="all", probability=0.3, configuration=conf,
            params={"how": "rate_limit", "retry_after": 1, "seed": 11},
        )  # fmt: skip
        common: dict[str, Any] = {"url": lab.url, "rate_rps": 6, "duration_s": 4, "max_tokens": 8}
        runs = {
            "ours": LoadSpec(**common, retry_attempts=3, retry_backoff_s=0.2, seed=1),
            "ours-honouring": LoadSpec(
                **common, retry_attempts=3, retry_backoff_s=0.2, retry_after_max_s=30, seed=2
            ),
            "sdk": LoadSpec(**common, client="openai-sdk", seed=3),
        }
        results = {name: _load(spec, tmp_path / f"{name}.jsonl") for name, spec in runs.items()}
        ef.clear_engine_faults(configuration=conf)
        ledger = read_jsonl(lab_dir / "ledger.jsonl")
        figs: dict[str, dict[str, Any]] = {}
        for name, (summary, recs) in results.items():
            ids = {r["request_id"] for r in recs}
            f = figs[name] = provider_error_figures(ledger, ids)
            # every arrival at the engine is one recorded attempt: no silent SDK retry, and no
            # gateway retry of a 429 (HAProxy passes it through)
            arrivals = Counter(
                e["request_id"]
                for e in ledger
                if e.get("request_id") in ids and (e.get("event") == "generation" or "answer" in e)
            )
            assert arrivals == Counter(r["request_id"] for r in recs), name
            assert f["retry_after_retried"] >= 2, (name, f)  # the fault was met and retried
            assert f["load_amplification"] > 1.0 and f["retried_final"] == 0
            assert all(r["retry_after_s"] == 1.0 for r in recs if r["status"] == 429), name
            assert summary["retries"] == summary["attempts"] - summary["sent"] > 0
        # the SDK honours Retry-After on every retry, against the engine's clock
        assert figs["sdk"]["retry_after_honoured_share"] == 1.0, figs["sdk"]
        assert all(
            1.0 - RETRY_AFTER_TOLERANCE_S <= w < 2.0 for w, _ in figs["sdk"]["retry_after_waits_s"]
        ), figs["sdk"]["retry_after_waits_s"]
        sdk_summary = results["sdk"][0]
        assert sdk_summary["client"]["name"] == "openai-sdk"
        assert sdk_summary["client"]["policy"]["max_retries"] == 2
        assert all(r["client"] == "openai-sdk" for r in results["sdk"][1])
        # ours by default: its own backoff (0.2 s x 2^n, +-20 %), never the server's second
        assert figs["ours"]["retry_after_honoured_share"] == 0.0, figs["ours"]
        assert all(w < 0.6 for w, _ in figs["ours"]["retry_after_waits_s"])
        assert results["ours"][0]["client"] == {"name": "chaoslib-infer", "transport": "raw"}
        # ours, told to honour it
        assert figs["ours-honouring"]["retry_after_honoured_share"] == 1.0, figs["ours-honouring"]
    finally:
        lab.down()
