"""Locust integration (optional extra ``locust``: ``pip install 'chaoslib-infer[locust]'``).

* ``chaoslib_infer.locust.user``: ``LLMStreamUser``, a Locust user on Locust's ``FastHttpUser``
  client that streams chat or completions and writes one record per attempt in this project's
  format (``docs/contracts.md`` section 3), while Locust still gets one request event per attempt
  (web UI, CSV stats, distributed mode). ``RecordStreams`` wraps an existing user's tasks.
  Importing it imports Locust, which monkey-patches the process with gevent: import it from a
  locustfile, never from the chaos runner.
* ``chaoslib_infer.locust.control``: the drills' load control with ``engine: locust`` (starts
  Locust headless as a separate process, stops it with the drill, reports lost workers). It does
  not import Locust.

This package module imports nothing from Locust.
"""
