"""Shared test fixtures.

Every lab a test brings up lives under its ``tmp_path``. Whatever the test's outcome, the autouse
fixture below takes down any lab still running there, so a failing assertion never leaves
supervisord, HAProxy or engine processes (or cgroups, namespaces) behind for the next test.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from labutil import GamedayRun, require_lab, run_default_gameday

# CHAOS_INFER_REQUIRE_LAB=1 (scripts/quickstart test): a lab test skipped for want of the lab fails
pytest_runtest_makereport = require_lab

# The operator's Kubernetes allowlist for the suite's fake clusters (issue 13: a target file can
# only narrow it, never grant it). Subprocesses the tests start inherit it.
os.environ.setdefault("CHAOS_INFER_ALLOW_CONTEXTS", "kind-*")
os.environ.setdefault("CHAOS_INFER_ALLOW_NAMESPACES", "llm")
# The shipped lab experiments size their warm-up for a powered baseline (load_warmup_s: auto,
# 25 s at 8 req/s); the suite's own drills keep the 8 s they were written for (CI time), and
# the default game day runs as shipped (labutil.run_default_gameday drops this).
os.environ.setdefault("CHAOS_INFER_LOAD_WARMUP_S", "8")
# The suite's runs write no history store (issue 32): the default, .chaos-infer/history.sqlite,
# would be the checkout's and shared by every run; the history tests name their own (--history).
os.environ.setdefault("CHAOS_INFER_HISTORY", "off")


# A suite started from a non-interactive shell's background job (`.ci/run &`) inherits SIGINT
# ignored, and so would every runner it starts: the Ctrl-C tests would then send a signal nobody
# hears. Restore Python's handler here; children get the default disposition back (a handler,
# unlike SIG_IGN, does not survive exec) and install their own.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--k8s-by-file",
        action="store_true",
        help="under pytest-xdist, group the fake-Kubernetes tests by file instead of all together "
        "(the fast tier: quicker, and the RBAC test then checks the requests of its own worker)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "k8s_rbac_last: run after every other test of the session (the RBAC test checks every "
        "request the suite sent to the fake Kubernetes API)",
    )
    # pytest-xdist registers it when installed; the suite also runs without it
    config.addinivalue_line("markers", "xdist_group(name): run with the tests of that group")


#: Fixtures whose one run serves tests in several files: under pytest-xdist those tests share a
#: worker (an ``xdist_group`` of that name), so the run happens once per session, not per worker.
SHARED_RUNS = ("default_gameday",)


def _xdist_group(item: pytest.Item) -> str:
    """The pytest-xdist group of ``item`` (``--dist loadgroup``, scripts/quickstart test).

    A test that reads a shared run goes with that run; a test that talks to a fake Kubernetes API
    goes with every other such test, so the RBAC test (last of the group) sees all their requests
    in its own process; every other test stays with its file, so a module-scoped lab is brought up
    once."""
    names = getattr(item, "fixturenames", ())
    for shared in SHARED_RUNS:
        if shared in names:
            return shared
    module = getattr(item, "module", None)
    by_file = item.nodeid.split("::", 1)[0]
    if item.config.getoption("--k8s-by-file"):
        return by_file
    fakes = ("fake_k8s", "k8s_sim")  # `import fake_k8s`, or names imported from it
    if module is not None and any(
        name in fakes or getattr(v, "__module__", "") in fakes for name, v in vars(module).items()
    ):
        return "k8s"
    return by_file


def pytest_itemcollected(item: pytest.Item) -> None:
    """Give every test its pytest-xdist group (:func:`_xdist_group`) as it is collected: xdist reads
    the marker in its own ``pytest_collection_modifyitems``, which runs before ours."""
    if not any(True for _ in item.iter_markers("xdist_group")):
        item.add_marker(pytest.mark.xdist_group(_xdist_group(item)))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Order the session for pytest-xdist's ``--no-loadscope-reorder`` (scripts/quickstart test).

    The tests marked ``k8s_rbac_last`` go last: by then every fake API server of the other files
    has closed and added its requests to ``fake_k8s.ALL_REQUESTS``. Groups that bring up labs
    (largest lab weight first) alternate with groups that do not, two to one: with
    :data:`LAB_SLOTS` labs at a time, the worker a lab group would make wait runs light tests
    instead, from the start of the session to its end (sorted by size, xdist's own order, left
    the lab groups for a tail where every worker held one)."""
    for item in items:  # the first of them runs the session's game day (minutes) in its setup
        if "default_gameday" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.timeout(DEFAULT_GAMEDAY_TIMEOUT_S))
    last = [i for i in items if i.get_closest_marker("k8s_rbac_last")]
    if last:
        items[:] = [i for i in items if not i.get_closest_marker("k8s_rbac_last")] + last
    groups: dict[str, list[pytest.Item]] = {}
    for item in items:
        marker = item.get_closest_marker("xdist_group")
        groups.setdefault(marker.args[0] if marker else item.nodeid, []).append(item)

    def lab_weight(members: list[pytest.Item]) -> float:  # estimated lab seconds
        group = next(members[0].iter_markers("xdist_group")).args[0] if members else ""
        labs = sum(1 for i in members if i.get_closest_marker("lab"))
        return LAB_GROUP_SECONDS.get(group, 20.0 * labs) if labs else 0.0

    labs = sorted((g for g in groups.values() if lab_weight(g)), key=lab_weight, reverse=True)
    light = sorted((g for g in groups.values() if not lab_weight(g)), key=len, reverse=True)
    ordered: list[list[pytest.Item]] = []
    while labs or light:
        ordered += labs[:2] + light[:1]
        labs, light = labs[2:], light[1:]
    items[:] = [i for members in ordered for i in members]


#: pytest-timeout's limit (s) for a test that reads the session's default game day: the first one
#: waits for a lab slot and runs the game day (~6 min on a busy CI run) in its setup
DEFAULT_GAMEDAY_TIMEOUT_S = 1500

#: seconds the longest lab groups took in a CI run (pass 1's 40 slowest tests, 2026-12-03); other
#: groups count 20 s per lab test. Only the order of the groups depends on it (longest first)
LAB_GROUP_SECONDS = {
    "tests/test_interruptions.py": 600.0,
    "tests/test_well_run.py": 290.0,
    "default_gameday": 300.0,
    "tests/test_verdict_lab.py": 230.0,
    "tests/test_gateway_lab.py": 165.0,
    "tests/test_safety_lab.py": 130.0,
    "tests/test_drill_traffic_spike.py": 110.0,
    "tests/test_drill_network_jitter.py": 100.0,
    "tests/test_drill_node_loss.py": 95.0,
    "tests/test_drill_quota_cut.py": 85.0,
    "tests/test_gameday_e2e.py": 80.0,
    "tests/test_drill_simultaneous_restarts.py": 72.0,
    "tests/test_drill_upstream_timeout.py": 66.0,
}

#: labs up at once across the pytest-xdist workers (``CHAOS_INFER_TEST_LAB_SLOTS``, default 2):
#: on a 2-core machine three labs at once starved their engines and HAProxy checks (a CI run
#: failed six verdict and ground-truth tests that pass alone); the other workers run light tests
LAB_SLOTS = max(1, int(os.environ.get("CHAOS_INFER_TEST_LAB_SLOTS") or 2))


@contextlib.contextmanager
def lab_slot(base: Path) -> Iterator[None]:
    """Hold one of :data:`LAB_SLOTS` lock files under ``base`` (shared by the session's workers)
    while the block runs; waits, polling every 0.2 s, until one is free."""
    base.mkdir(parents=True, exist_ok=True)
    while True:
        for n in range(LAB_SLOTS):
            fd = os.open(base / f"lab-slot-{n}.lock", os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            try:
                yield
                return
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
        time.sleep(0.2)


def _slots_dir(config: pytest.Config) -> Path:
    """The lock files' folder, one per test session: pytest-xdist's workers share its
    ``testrunuid`` (documented in ``workerinput``); a run without xdist uses its own pid."""
    workerinput = getattr(config, "workerinput", None) or {}
    run = workerinput.get("testrunuid") or f"pid{os.getpid()}"
    return Path(tempfile.gettempdir()) / f"chaos-infer-lab-slots-{run}"


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[object]:
    """A test marked ``lab`` runs while it holds a lab slot (see :data:`LAB_SLOTS`). The slot is
    taken here, around the whole test and outside pytest-timeout's timer (its own wrapper of
    this hook, which runs inside this one): the wait for a slot (minutes on a busy CI run) is
    not the test's time, and a CI run timed a lab test out on it (376 s of wait + 224 s)."""
    if item.get_closest_marker("lab") is None or "default_gameday" in item.fixturenames:
        return (yield)  # a test that reads the session's game day: the fixture holds the slot
    with lab_slot(_slots_dir(item.config)):
        return (yield)


@pytest.fixture(scope="session")
def default_gameday(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GamedayRun]:
    """The README's main job run once for the session (``chaos-infer gameday``: the default plan
    on the default lab); the tests that only read one of its drills' outcomes share it."""
    out = tmp_path_factory.mktemp("default-gameday") / "gd"
    with lab_slot(_slots_dir(request.config)):
        run = run_default_gameday(out)
    yield run
    _down_if_running(out / "lab")  # the game day takes its lab down; make sure of it


def _down_if_running(lab_dir: Path) -> None:
    """Take down the lab in ``lab_dir`` if its supervisord still runs (errors ignored)."""
    from chaoslib_infer.lab.fleet import Lab

    with contextlib.suppress(Exception):
        lab = Lab.attach(lab_dir)
        if lab.supervisord_alive():
            lab.down()


@pytest.fixture(autouse=True)
def _take_down_leftover_labs(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    started: list[str] = []
    for lab_json in tmp_path.rglob("lab.json"):
        if (lab_json.parent / "supervisord.conf").exists():
            started.append(str(lab_json.parent))
        _down_if_running(lab_json.parent)
    # the fast tier (scripts/quickstart test-fast: -m "not lab and not slow ...") promises no lab
    if started and request.node.get_closest_marker("lab") is None:
        pytest.fail(f"brought up a lab ({started[0]}) but is not marked lab", pytrace=False)
