"""Record a team's locustfile by subclassing its user and overriding the method its tasks call.

``StreamingUser`` comes first: it brings the recording client (``self.stream``), the team's class
keeps its tasks, weights and ``wait_time``. Only ``ask`` (the method both tasks call) changes:
it sends the same body through ``self.stream``, which records every attempt (chunk times, error
class, ``X-Request-Id``, retries) and fires Locust's request event for each.

Import the team's *module*, not its class: Locust runs every user class it finds in the
locustfile's namespace, and would run the unrecorded one too.

    locust -f examples/locust/subclass.py --headless -u 10 -r 5 -t 30s \
        --host http://127.0.0.1:8800 --chaos-records records.jsonl
"""

from __future__ import annotations

import team_locustfile

from chaoslib_infer.locust.user import StreamingUser


class RecordedTeamChatUser(StreamingUser, team_locustfile.TeamChatUser):
    """The team's user, recorded; retried once on transport errors, timeouts, 5xx and 429."""

    model = team_locustfile.TeamChatUser.model  # StreamingUser's attributes come first
    timeout_s = 60.0
    ttft_timeout_s = 20.0
    retry_attempts = 2

    def ask(self, prompt: str, max_tokens: int) -> None:
        # no content is already a failure of its own class ("empty") in the record
        self.stream(self.body(prompt, max_tokens))
