"""Record a team's locustfile without touching its tasks: wrap its user class.

``RecordStreams`` first, the team's class second. Its tasks run unchanged; their
``self.client.post(".../chat/completions", json={... "stream": True ...})`` is sent by the
recording client (one record and one Locust request event per attempt) and answered with the
received body once the stream has ended, so the task's own ``iter_lines`` loop still reads it.
Other requests (logins, health checks) go to Locust's client as before. The task's
``resp.failure(...)`` is a no-op on a recorded call: the attempt's verdict is the recorded one.

    locust -f examples/locust/wrapped.py --headless -u 10 -r 5 -t 30s \
        --host http://127.0.0.1:8800 --chaos-records records.jsonl
"""

from __future__ import annotations

import team_locustfile

from chaoslib_infer.locust.user import RecordStreams


class RecordedTeamChatUser(RecordStreams, team_locustfile.TeamChatUser):
    """The team's user with every streaming completion recorded."""

    timeout_s = 60.0
    ttft_timeout_s = 20.0
