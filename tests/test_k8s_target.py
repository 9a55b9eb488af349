"""Kubernetes target file: parsing, allowlist refusal (one line, exit 2), no API call when refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from chaoslib.exceptions import ActivityFailed
from fake_k8s import FakeK8s, make_cluster, write_target
from labutil import run_module

from chaoslib_infer.activities import k8s
from chaoslib_infer.errors import ConfigError
from chaoslib_infer.platforms.kubernetes.target import load_target


@pytest.fixture()
def fake(tmp_path: Path):
    with FakeK8s() as f:
        make_cluster(f)
        f.write_kubeconfig(tmp_path / "kubeconfig", contexts=("kind-lab", "prod-eu-1"))
        yield f


def test_target_loads_and_resolves_current_context(tmp_path: Path, fake: FakeK8s) -> None:
    path = write_target(
        tmp_path / "t.yaml", tmp_path / "kubeconfig", context=None, url="http://svc:8000/"
    )
    t = load_target(path)
    assert (t.namespace, t.selector, t.container, t.url) == (
        "llm",
        "app=vllm",
        "vllm",
        "http://svc:8000",
    )
    assert t.context is None and t.allow_contexts == ("kind-*",)


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        (
            {"context": "prod-eu-1"},
            "context 'prod-eu-1' is not in the allowlist (allow.contexts: kind-*)",
        ),
        (
            {"namespace": "kube-system"},
            "namespace 'kube-system' is not in the allowlist (allow.namespaces: llm)",
        ),
        ({"allow": {"contexts": ["kind-*"]}}, "allow.namespaces must be a non-empty list"),
        ({"allow": None}, "missing 'allow:'"),
        ({"selector": None}, "missing required field 'selector'"),
        ({"namesapce": "llm"}, "unknown field(s) namesapce"),
    ],
)
def test_bad_targets_refused_with_one_line(
    tmp_path: Path, fake: FakeK8s, fields: dict, needle: str
) -> None:
    path = write_target(tmp_path / "t.yaml", tmp_path / "kubeconfig", **fields)
    with pytest.raises(ConfigError) as err:
        load_target(path)
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


def test_current_context_outside_allowlist_is_refused(tmp_path: Path, fake: FakeK8s) -> None:
    fake.write_kubeconfig(tmp_path / "kubeconfig", contexts=("prod-eu-1", "kind-lab"))
    path = write_target(tmp_path / "t.yaml", tmp_path / "kubeconfig", context=None)
    with pytest.raises(ConfigError, match="context 'prod-eu-1' is not in the allowlist"):
        load_target(path)


def test_cli_check_exits_2_with_one_line(tmp_path: Path, fake: FakeK8s) -> None:
    bad = write_target(tmp_path / "bad.yaml", tmp_path / "kubeconfig", context="prod-eu-1")
    proc = run_module("chaoslib_infer.platforms.kubernetes.target", str(bad), timeout=60, cwd=None)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "not in the allowlist" in proc.stderr
    good = write_target(tmp_path / "good.yaml", tmp_path / "kubeconfig")
    proc = run_module("chaoslib_infer.platforms.kubernetes.target", str(good), timeout=60, cwd=None)
    assert proc.returncode == 0 and "context kind-lab, namespace llm" in proc.stdout


def test_action_on_refused_target_makes_no_api_call(tmp_path: Path, fake: FakeK8s) -> None:
    path = write_target(tmp_path / "t.yaml", tmp_path / "kubeconfig", namespace="kube-system")
    cfg = {"infer_run_dir": str(tmp_path / "run")}
    with pytest.raises(ActivityFailed, match="namespace 'kube-system' is not in the allowlist"):
        k8s.k8s_simultaneous_restarts(count=1, target_file=str(path), configuration=cfg)
    assert fake.requests == []
    assert len(fake.pods("llm")) == 3
