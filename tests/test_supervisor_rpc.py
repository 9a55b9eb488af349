"""supervisor_rpc.start_process against a real XML-RPC server on a unix socket.

The server answers ``supervisor.startProcess`` the way supervisord does: ``True`` for a stopped
program, fault 60 (``ALREADY_STARTED``) for one that is running, starting or in backoff (e.g.
respawned by supervisord's own ``autorestart`` a moment before the call: the race that left a
simultaneous-restarts record in the ledger on a loaded CI machine), fault 10 (``BAD_NAME``) for
an unknown one.
"""

from __future__ import annotations

import socketserver
import threading
import xmlrpc.client
from collections.abc import Iterator
from pathlib import Path
from xmlrpc.server import SimpleXMLRPCDispatcher, SimpleXMLRPCRequestHandler

import pytest

from chaoslib_infer.lab.statedir import SUPERVISOR_SOCK
from chaoslib_infer.lab.supervisor_rpc import ALREADY_STARTED, start_process


class _UnixXMLRPCServer(
    socketserver.ThreadingMixIn, socketserver.UnixStreamServer, SimpleXMLRPCDispatcher
):
    """SimpleXMLRPCServer's own composition (a dispatcher and a socket server), on a unix socket."""

    daemon_threads = True

    def __init__(self, path: str) -> None:
        SimpleXMLRPCDispatcher.__init__(self, allow_none=True)
        self.logRequests = False
        socketserver.UnixStreamServer.__init__(self, path, _Handler)


class _Handler(SimpleXMLRPCRequestHandler):
    rpc_paths = ("/RPC2",)
    disable_nagle_algorithm = False  # TCP_NODELAY does not apply to a unix socket

    def address_string(self) -> str:  # a unix socket has no peer address
        return "unix"


@pytest.fixture()
def supervisord(tmp_path: Path) -> Iterator[tuple[Path, list[str]]]:
    calls: list[str] = []
    states = {"stopped": "STOPPED", "respawned": "STARTING", "backoff": "BACKOFF"}

    def start_process(name: str, wait: bool = True) -> bool:
        calls.append(name)
        if name not in states:
            raise xmlrpc.client.Fault(10, f"BAD_NAME: {name}")
        if states[name] != "STOPPED":
            raise xmlrpc.client.Fault(ALREADY_STARTED, f"ALREADY_STARTED: {name}")
        states[name] = "RUNNING"
        return True

    server = _UnixXMLRPCServer(str(tmp_path / SUPERVISOR_SOCK))
    server.register_function(start_process, "supervisor.startProcess")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield tmp_path, calls
    finally:
        server.shutdown()
        server.server_close()


def test_start_process_starts_a_stopped_program_once(supervisord: tuple[Path, list[str]]) -> None:
    state_dir, calls = supervisord
    assert start_process(state_dir, "stopped") is True
    assert start_process(state_dir, "stopped") is False  # now running: already started
    assert calls == ["stopped", "stopped"]


@pytest.mark.parametrize("name", ["respawned", "backoff"])
def test_a_program_supervisord_already_restarts_is_not_an_error(
    supervisord: tuple[Path, list[str]], name: str
) -> None:
    state_dir, calls = supervisord
    assert start_process(state_dir, name) is False
    assert calls == [name]


def test_other_refusals_and_a_dead_supervisord_raise(
    supervisord: tuple[Path, list[str]], tmp_path: Path
) -> None:
    state_dir, _ = supervisord
    with pytest.raises(xmlrpc.client.Fault) as info:
        start_process(state_dir, "nope")
    assert info.value.faultCode == 10
    with pytest.raises(OSError):
        start_process(tmp_path / "no-lab-here", "stopped")
