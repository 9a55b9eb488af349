"""Tiny stand-in for ``chaoslib_infer.lab.engine`` used by the fleet tests (stdlib only).

Same command line subset: ``--host --port --replica-id --ledger --load-delay-s``. ``/health``
answers 503 until the load delay has passed, then 200; every other GET/POST answers a small JSON
body and appends a ``generation`` line to the ledger. Every response carries ``X-Replica-Id`` and
echoes ``X-Request-Id``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    """Serve until killed."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--replica-id", required=True)
    parser.add_argument("--ledger", default=None)
    parser.add_argument("--load-delay-s", type=float, default=0.0)
    args, _unknown = parser.parse_known_args()
    ready_at = time.monotonic() + args.load_delay_s

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *a: object) -> None:  # noqa: A002
            pass

        def _send(self, status: int, body: dict[str, object]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("X-Replica-Id", args.replica_id)
            self.send_header("X-Request-Id", self._rid)
            self.end_headers()
            self.wfile.write(data)

        def _handle(self) -> None:
            self._rid = self.headers.get("X-Request-Id") or uuid.uuid4().hex
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            if time.monotonic() < ready_at:
                self._send(503, {"error": "loading"})
                return
            if self.path == "/health":
                self._send(200, {"status": "ok"})
                return
            if args.ledger:
                line = (
                    json.dumps(
                        {
                            "t": time.time(),
                            "replica": args.replica_id,
                            "request_id": self._rid,
                            "pid": os.getpid(),
                            "event": "generation",
                        }
                    )
                    + "\n"
                )
                fd = os.open(args.ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    os.write(fd, line.encode())
                finally:
                    os.close(fd)
            self._send(200, {"replica": args.replica_id, "text": "hello"})

        do_GET = _handle
        do_POST = _handle

    ThreadingHTTPServer.daemon_threads = True
    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
