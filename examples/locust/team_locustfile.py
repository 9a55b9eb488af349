"""A team's existing locustfile for its inference service (the kind this directory starts from).

Nothing here knows chaoslib-infer: a ``FastHttpUser`` streams chat completions and checks that
some content came back. ``subclass.py`` and ``wrapped.py`` record it without rewriting it.

    locust -f examples/locust/team_locustfile.py --headless -u 10 -r 5 -t 30s --host http://127.0.0.1:8800
"""

from __future__ import annotations

import json
import os
import random

from locust import FastHttpUser, between, task

SHORT = ["What is a KV cache?", "Name three sorting algorithms.", "Say hello in French."]
LONG = "Summarise the history of the printing press in five paragraphs. " * 8


class TeamChatUser(FastHttpUser):
    """Short questions three times as often as a long summary, streamed."""

    wait_time = between(0.2, 0.6)
    model = os.environ.get("MODEL", "sim")

    @task(3)
    def short_chat(self) -> None:
        self.ask(random.choice(SHORT), max_tokens=32)

    @task(1)
    def long_chat(self) -> None:
        self.ask(LONG, max_tokens=64)

    def ask(self, prompt: str, max_tokens: int) -> None:
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "stream": True,
        }
        with self.client.post(
            "/v1/chat/completions", json=body, stream=True, catch_response=True
        ) as resp:
            pieces = []
            for line in resp.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    for choice in json.loads(line[6:]).get("choices", []):
                        pieces.append((choice.get("delta") or {}).get("content") or "")
            if not "".join(pieces):
                resp.failure("no content")
