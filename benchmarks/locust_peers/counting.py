"""Plain Locust, the peer to beat: FastHttpUser streams a completion and only counts its SSE
chunks (no parsing, no per-chunk time, no record). ``benchmarks/client_ceiling.py --peers locust``.
"""

from __future__ import annotations

import json
import os

from locust import FastHttpUser, task

MAX_TOKENS = int(os.environ.get("CEILING_MAX_TOKENS", "32"))
MODEL = os.environ.get("CEILING_MODEL", "chaos-sim")
BODY = json.dumps(
    {
        "model": MODEL,
        "prompt": "alpha bravo charlie delta echo foxtrot golf hotel",
        "max_tokens": MAX_TOKENS,
        "stream": True,
        "ignore_eos": True,
    }
)


class Counting(FastHttpUser):
    """One request after another (closed loop), chunks counted as they arrive."""

    @task
    def stream(self) -> None:
        with self.client.post(
            "/v1/completions",
            data=BODY,
            headers={"Content-Type": "application/json"},
            stream=True,
            catch_response=True,
        ) as resp:
            chunks = 0
            for block in resp.stream:
                chunks += block.count(b"data:")
            if chunks == 0:
                resp.failure("no chunk")
