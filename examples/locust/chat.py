"""The smallest recorded locustfile: ``LLMStreamUser``'s default task streams a chat completion
with a random nonce prompt (as the built-in load client does).

Offered load: ``-u`` users x ``constant_throughput`` requests/s each, closed loop (a user waits
for its reply): not an open-loop schedule, so latency under overload is under-reported.

    locust -f examples/locust/chat.py --headless -u 8 -r 8 -t 30s \
        --host http://127.0.0.1:8800 --chaos-records records.jsonl --csv locust
"""

from __future__ import annotations

from locust import constant_throughput

from chaoslib_infer.locust.user import LLMStreamUser


class Chat(LLMStreamUser):
    wait_time = constant_throughput(1)
    model = "chaos-sim"
    max_tokens = 24
    timeout_s = 15.0
