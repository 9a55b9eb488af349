"""Shared test fixtures.

Every lab a test brings up lives under its ``tmp_path``. Whatever the test's outcome, the autouse
fixture below takes down any lab still running there, so a failing assertion never leaves
supervisord, HAProxy or engine processes (or cgroups, namespaces) behind for the next test.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

# The operator's Kubernetes allowlist for the suite's fake clusters (issue 13: a target file can
# only narrow it, never grant it). Subprocesses the tests start inherit it.
os.environ.setdefault("CHAOS_INFER_ALLOW_CONTEXTS", "kind-*")
os.environ.setdefault("CHAOS_INFER_ALLOW_NAMESPACES", "llm")


# A suite started from a non-interactive shell's background job (`.ci/run &`) inherits SIGINT
# ignored, and so would every runner it starts: the Ctrl-C tests would then send a signal nobody
# hears. Restore Python's handler here; children get the default disposition back (a handler,
# unlike SIG_IGN, does not survive exec) and install their own.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "k8s_rbac_last: run after every other test of the session (the RBAC test checks every "
        "request the suite sent to the fake Kubernetes API)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Move the tests marked ``k8s_rbac_last`` to the end of the session: by then every fake API
    server of the other files has closed and added its requests to ``fake_k8s.ALL_REQUESTS``
    (module fixtures are torn down before the next file's first test)."""
    last = [i for i in items if i.get_closest_marker("k8s_rbac_last")]
    if last:
        items[:] = [i for i in items if not i.get_closest_marker("k8s_rbac_last")] + last


@pytest.fixture(autouse=True)
def _take_down_leftover_labs(tmp_path: Path) -> Iterator[None]:
    yield
    from chaoslib_infer.lab.fleet import Lab

    for lab_json in tmp_path.rglob("lab.json"):
        with contextlib.suppress(Exception):
            lab = Lab.attach(lab_json.parent)
            if lab.supervisord_alive():
                lab.down()
