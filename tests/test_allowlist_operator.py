"""Issue 13: an operator-owned allowlist that a target file can narrow but never widen; every
outbound HTTP client goes through it and never follows a redirect; URLs with control characters
are refused (raw transport too)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from chaoslib.exceptions import ActivityFailed
from labutil import QuietHandler, serve_http

from chaoslib_infer.errors import ConfigError
from chaoslib_infer.safety import allowlist

ROOT = Path(__file__).resolve().parent.parent


# ---- match-everything patterns and control characters ---------------------------------------
@pytest.mark.parametrize(
    "pattern",
    [
        "*://*:*",
        "https://*",
        "http://*:8000",
        "*://?*:*",
        "http://0.0.0.0/0:*",
        "*://[::]/0:*",
    ],  # fmt: skip
)
def test_match_everything_patterns_are_refused(pattern: str) -> None:
    with pytest.raises(ConfigError, match="every"):
        allowlist.parse_pattern(pattern)


def test_globs_with_a_literal_part_still_work() -> None:
    assert allowlist.is_allowed(
        "https://a.corp.example", [allowlist.parse_pattern("https://*.corp.example")]
    )


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8000/v1\r\nX-Evil: 1",
        "http://127.0.0.1:8000/v1\n",
        "http://127.0.0.1/a b",
        "http://127.0.0.1/\x00",
        "http://127.0.0.1/\x7f",
    ],  # fmt: skip
)
def test_control_characters_are_refused(url: str) -> None:
    with pytest.raises(ConfigError, match="control character"):
        allowlist.check_target(url)


def test_raw_transport_refuses_control_characters() -> None:
    from chaoslib_infer.load.client import LoadSpec
    from chaoslib_infer.load.rawhttp import RawSession

    ok = RawSession(LoadSpec(url="http://127.0.0.1:1"))
    assert ok.head("http://127.0.0.1:1/v1/chat/completions")[1].startswith(b"POST /v1/chat")
    with pytest.raises(ValueError, match="control character"):
        ok.head("http://127.0.0.1:1/v1\r\nHost: evil")
    with pytest.raises(ValueError, match="header"):
        RawSession(LoadSpec(url="http://127.0.0.1:1", headers={"X-A": "1\r\nX-Injected: 2"}))


# ---- the operator's patterns reach experiments through configuration ------------------------
def test_configuration_patterns_and_no_environment_mutation() -> None:
    with pytest.raises(ConfigError, match="outside the allowlist"):
        allowlist.check_target("http://10.1.2.3:8000")
    allowlist.check_target(
        "http://10.1.2.3:8000", configuration={"infer_allow": "http://10.1.2.3:8000"}
    )
    # nothing in the package passes the allowlist along by writing the process environment
    writes = re.compile(r"os\.environ\[(ENV_VAR|\"CHAOS_INFER_ALLOW[A-Z_]*\")\]\s*=|"
                        r"os\.environ\.(update|setdefault)\(.*ALLOW")  # fmt: skip
    hits = [
        f"{p}:{i}"
        for p in (ROOT / "chaoslib_infer").rglob("*.py")
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if writes.search(line)
    ]
    assert hits == []


# ---- a Kubernetes target file narrows, never widens -----------------------------------------
def _target(
    tmp: Path, context: str, namespace: str, contexts: list[str], namespaces: list[str]
) -> Path:
    doc = {"context": context, "namespace": namespace, "selector": "app=vllm", "container": "vllm",
           "url": "http://127.0.0.1:8000/v1", "allow": {"contexts": contexts, "namespaces": namespaces}}  # fmt: skip
    path = tmp / "target.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_target_file_cannot_grant_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from chaoslib_infer.platforms.kubernetes.target import load_target

    monkeypatch.delenv(allowlist.K8S_CONTEXTS_ENV, raising=False)
    monkeypatch.delenv(allowlist.K8S_NAMESPACES_ENV, raising=False)
    path = _target(tmp_path, "prod-eu-1", "llm", ["prod-eu-1"], ["llm"])
    with pytest.raises(ConfigError, match="no operator allowlist for Kubernetes contexts"):
        load_target(path)
    # the operator allows kind-* only: the file's prod-eu-1 stays refused
    monkeypatch.setenv(allowlist.K8S_CONTEXTS_ENV, "kind-*")
    monkeypatch.setenv(allowlist.K8S_NAMESPACES_ENV, "llm")
    with pytest.raises(ConfigError, match="context 'prod-eu-1' is not in the operator's allowlist"):
        load_target(path)
    # the file narrows: operator kind-*, file kind-lab, context kind-other -> refused by the file
    path = _target(tmp_path, "kind-other", "llm", ["kind-lab"], ["llm"])
    with pytest.raises(ConfigError, match="allow.contexts: kind-lab"):
        load_target(path)
    path = _target(tmp_path, "kind-lab", "llm", ["kind-lab"], ["llm"])
    assert load_target(path).namespace == "llm"
    # namespaces the same way; the plan and the configuration are operator sources too
    path = _target(tmp_path, "kind-lab", "team-b", ["kind-lab"], ["team-b"])
    with pytest.raises(ConfigError, match="namespace 'team-b' is not in the operator's"):
        load_target(path)
    assert (
        load_target(path, configuration={"infer_allow_namespaces": "team-b"}).namespace == "team-b"
    )
    plan = tmp_path / "plan.yaml"
    plan.write_text("name: p\ndrills: []\nallow:\n  urls: []\n  namespaces: [team-b]\n")
    assert load_target(path, plan_path=plan).namespace == "team-b"


@pytest.mark.parametrize("bare", ["*", "**", "?*"])
def test_bare_star_is_refused_everywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bare: str
) -> None:
    from chaoslib_infer.platforms.kubernetes.target import load_target

    with pytest.raises(ConfigError, match="would allow every name"):
        load_target(_target(tmp_path, "kind-lab", "llm", [bare], ["llm"]))
    monkeypatch.setenv(allowlist.K8S_CONTEXTS_ENV, bare)
    with pytest.raises(ConfigError, match="would allow every name"):
        load_target(_target(tmp_path, "kind-lab", "llm", ["kind-lab"], ["llm"]))


# ---- outbound clients: allowlist and no redirect --------------------------------------------
class _Redirect(QuietHandler):
    hits: list[str] = []

    def do_GET(self) -> None:  # noqa: N802
        _Redirect.hits.append(self.path)
        if self.path.startswith("/elsewhere"):
            body = b'{"status": "success", "data": {"resultType": "vector", "result": []}}'
            self.send_response(200)
        else:
            body = b"moved"
            self.send_response(302)
            self.send_header("Location", "/elsewhere" + self.path)
        self.send_body(body)


@pytest.fixture
def redirector() -> Iterator[str]:
    _Redirect.hits = []
    with serve_http(_Redirect) as url:
        yield url


def test_prometheus_probe_allowlist_and_redirects(redirector: str) -> None:
    from chaoslib_infer.activities.prometheus import prometheus_query

    with pytest.raises(
        ActivityFailed, match="prometheus URL http://10.9.9.9:9090/api/v1/query is outside"
    ):
        prometheus_query("http://10.9.9.9:9090", "up")
    with pytest.raises(ActivityFailed, match="redirects are not followed"):
        prometheus_query(redirector, "up")
    assert [h for h in _Redirect.hits if h.startswith("/elsewhere")] == []


def test_metrics_scraper_allowlist_and_redirects(redirector: str, tmp_path: Path) -> None:
    from chaoslib_infer.measure.scrape import MetricsScraper, read_samples

    with pytest.raises(ConfigError, match="metrics URL http://10.9.9.9:8000/metrics is outside"):
        MetricsScraper(["http://10.9.9.9:8000/metrics"], tmp_path / "s.jsonl")
    with pytest.raises(ConfigError, match="control character"):
        MetricsScraper([redirector + "/metrics\r\nX: 1"], tmp_path / "s.jsonl")

    async def go() -> None:
        async with MetricsScraper([redirector + "/metrics"], tmp_path / "s.jsonl", interval_s=0.1):
            await asyncio.sleep(0.35)

    asyncio.run(go())
    samples = read_samples(tmp_path / "s.jsonl")
    assert samples and all(not s["ok"] and s["error"] == "HTTP 302" for s in samples)
    assert [h for h in _Redirect.hits if h.startswith("/elsewhere")] == []
