"""The drills judge provider error answers (issue 23 item 4): Retry-After honoured, final errors
retried, the retry storm's load amplification; ``n/a`` where the engine answered none. Synthetic
records and ledgers (``test_verdict_unit``'s helpers)."""

from __future__ import annotations

from typing import Any

import pytest
from test_verdict import GOOD
from test_verdict_unit import attempt, ledger_for, steady

from chaoslib_infer.evidence.figures import common_figures
from chaoslib_infer.verdict import DrillFacts, judge_drill
from chaoslib_infer.verdict.provider_errors import NO_ANSWER

T0 = 1_800_000_000.0


def _answered(rid: str, t: float, status: int, retry_after: int | None, retryable: bool = True
              ) -> dict[str, Any]:  # fmt: skip
    answer = {"status": status, "code": None, "retryable": retryable,
              "retry_after_s": retry_after, "profile": "vllm"}  # fmt: skip
    return {"t": t, "event": "fault", "mode": "http_error", "replica": "r1", "request_id": rid,
            "answer": answer}  # fmt: skip


def _drill(wait_s: float, final: bool = False) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Steady traffic in which 5 requests were answered 429 ``Retry-After: 1`` (or a final 400)
    and retried ``wait_s`` later, successfully."""
    records = steady(T0, T0 + 35)
    ledger = ledger_for(records)
    for i in range(5):
        rid, t = f"e{i}", T0 + 12 + i
        status = 400 if final else 429
        cls = "http_4xx" if final else "http_429"
        records.append(attempt(rid, t, final=False, ok=False, error_class=cls, first_token=None,
                               e2e=0.005) | {"status": status})  # fmt: skip
        records.append(attempt(rid, t + wait_s, n=2))
        ledger.append(_answered(rid, t + 0.001, status, None if final else 1, retryable=not final))
        ledger += ledger_for([records[-1]])
    return records, ledger


def _rows(drill: str, records: list[dict[str, Any]], ledger: list[dict[str, Any]]) -> Any:
    ground, good = GOOD[drill]
    v = judge_drill(DrillFacts(drill, records, {**good, **common_figures(records, ledger)}, ground))
    return v, {r["criterion"]: r for r in v.rows}


@pytest.mark.parametrize("drill", ["network-jitter", "oom-kill"])
def test_rows_are_na_without_an_answer(drill: str) -> None:
    records = steady(T0, T0 + 35)
    v, rows = _rows(drill, records, ledger_for(records))
    assert v.state == "passed", v.reasons
    for name in ("retry_after_honoured", "retried_final", "load_amplification"):
        assert (rows[name]["result"], rows[name]["note"]) == ("n/a", NO_ANSWER)


def test_a_client_that_ignores_retry_after_fails() -> None:
    v, rows = _rows("network-jitter", *_drill(wait_s=0.2))
    assert v.state == "failed"
    assert rows["retry_after_honoured"]["result"] == "fail"
    assert rows["retry_after_honoured"]["value"] == 0.0
    assert any(r.endswith("(retry_after_honoured)") for r in v.reasons), v.reasons
    assert rows["retried_final"]["result"] == "pass"
    # 355 requests, 360 arrivals: 1.014x, inside the 1.1x retry budget
    assert rows["load_amplification"]["result"] == "pass"
    assert rows["load_amplification"]["value"] == pytest.approx(360 / 355, abs=1e-4)


def test_a_client_that_waits_passes_those_rows() -> None:
    _, rows = _rows("network-jitter", *_drill(wait_s=1.05))
    assert rows["retry_after_honoured"]["result"] == "pass"
    assert rows["retry_after_honoured"]["value"] == 1.0
    assert rows["gave_up_retryable"]["result"] == "not judged"


def test_a_retried_final_400_fails_and_retry_after_is_na() -> None:
    v, rows = _rows("oom-kill", *_drill(wait_s=0.2, final=True))
    assert rows["retried_final"]["result"] == "fail" and rows["retried_final"]["value"] == 5
    assert any(r.endswith("(retried_final)") for r in v.reasons), v.reasons
    assert rows["retry_after_honoured"]["result"] == "n/a"  # no Retry-After to honour


def test_a_retry_storm_breaks_the_load_budget() -> None:
    records, ledger = _drill(wait_s=1.05)
    records = [r for r in records if r["request_id"].startswith("e")]  # only the faulted ones
    v, rows = _rows("network-jitter", records, ledger)
    assert rows["load_amplification"]["value"] == 2.0
    assert rows["load_amplification"]["result"] == "fail"
    assert any(r.endswith("(load_amplification)") for r in v.reasons), v.reasons
