"""The CI gate on skips: with ``CHAOS_INFER_REQUIRE_LAB=1`` (``scripts/quickstart test``) a test
skipped for want of the lab (its reason starts with ``labutil.LAB_MISSING``) fails, so a machine
without HAProxy or a memory cgroup cannot pass the suite by skipping every drill; other skips
stay skips. An inner pytest run over a folder whose conftest installs the same hook as ours.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from labutil import LAB_MISSING, REQUIRE_LAB_ENV, lab_skip_reason

TESTS = Path(__file__).resolve().parent

INNER = """
import pytest

@pytest.mark.skipif(True, reason={missing!r})
def test_needs_the_lab():
    pass

@pytest.mark.skipif(True, reason="nginx not installed (an optional gateway)")
def test_needs_an_optional_tool():
    pass

def test_runs_anywhere():
    pass
"""


def _inner(tmp_path: Path, gate: str | None) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text(
        textwrap.dedent(
            f"""
            import sys
            sys.path.insert(0, {str(TESTS)!r})
            from labutil import require_lab as pytest_runtest_makereport
            """
        )
    )
    (tmp_path / "test_inner.py").write_text(
        INNER.format(missing=LAB_MISSING + "haproxy not installed")
    )
    env = {k: v for k, v in os.environ.items() if k != REQUIRE_LAB_ENV}
    if gate is not None:
        env[REQUIRE_LAB_ENV] = gate
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rEs", "-p", "no:cacheprovider", "-p", "no:xdist"]
        + ["-o", "addopts=", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=env,
    )


def test_a_lab_test_skipped_for_want_of_the_lab_fails_under_the_gate(tmp_path: Path) -> None:
    gated = _inner(tmp_path, "1")
    # the skip happens in the test's setup: a failed setup, which pytest reports as an error
    assert gated.returncode == 1, gated.stdout
    assert "1 passed, 1 skipped, 1 error" in gated.stdout
    assert (
        f"{REQUIRE_LAB_ENV}=1 and this lab test was skipped: Skipped: {LAB_MISSING}haproxy not "
        "installed"
    ) in gated.stdout
    assert "ERROR test_inner.py::test_needs_the_lab" in gated.stdout
    # without the gate (a developer's machine, the fast tier) both are plain skips
    for gate in (None, "0"):
        plain = _inner(tmp_path, gate)
        assert plain.returncode == 0, plain.stdout
        assert "1 passed, 2 skipped" in plain.stdout


def test_every_lab_skip_reason_is_marked_for_the_gate() -> None:
    # on this machine the lab can run (None); elsewhere the reason carries the gate's mark
    reason = lab_skip_reason()
    assert reason is None or reason.startswith(LAB_MISSING)
    quickstart = (TESTS.parent / "scripts" / "quickstart").read_text()
    assert f'export {REQUIRE_LAB_ENV}="${{{REQUIRE_LAB_ENV}:-1}}"' in quickstart
