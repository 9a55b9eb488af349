"""``--api-key-file`` puts the key in ``$CHAOS_INFER_API_KEY`` for the run only (chaos-infer gameday)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from chaoslib_infer.cli import main
from chaoslib_infer.safety.redact import API_KEY_ENV

KEY = "sk-file-0123456789abcdef"


def _run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *extra: str) -> tuple[Any, dict]:
    seen: dict[str, str | None] = {}

    def fake_run_gameday(*_args: Any, **_kwargs: Any) -> int:
        seen["key"] = os.environ.get(API_KEY_ENV)  # what the load generator would inherit
        return 0

    monkeypatch.setattr("chaoslib_infer.gameday.run_gameday", fake_run_gameday)
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n", encoding="utf-8")
    res = CliRunner().invoke(
        main, ["gameday", "--api-key-file", str(key_file), "--out", str(tmp_path / "out"), *extra]
    )
    return res, seen


def test_key_set_for_the_run_and_unset_after(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    res, seen = _run(tmp_path, monkeypatch)
    assert res.exit_code == 0, res.output
    assert seen["key"] == KEY
    assert API_KEY_ENV not in os.environ
    assert KEY not in res.output


def test_key_from_the_environment_comes_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(API_KEY_ENV, "sk-env-before-0123456789")
    res, seen = _run(tmp_path, monkeypatch)
    assert res.exit_code == 0, res.output
    assert seen["key"] == KEY  # the file wins for the run, as before
    assert os.environ[API_KEY_ENV] == "sk-env-before-0123456789"


def test_key_restored_after_a_refused_plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    (tmp_path / "out-file").write_text("", encoding="utf-8")
    key_file = tmp_path / "key"
    key_file.write_text(KEY, encoding="utf-8")
    res = CliRunner().invoke(
        main, ["gameday", "--api-key-file", str(key_file), "--out", str(tmp_path / "out-file")]
    )
    assert res.exit_code == 2 and "exists and is not a folder" in res.output, res.output
    assert API_KEY_ENV not in os.environ
