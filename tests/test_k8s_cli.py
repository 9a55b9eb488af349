"""`chaos-infer ... --target TARGET.yaml`: the Kubernetes drills from the command line.

Against the HTTP-level fake API (tests/fake_k8s.py) and a simulated engine on loopback as the
target's url: the allowlist refusal and the dry run make no API call; one drill runs end to end
(subprocess, KUBECONFIG pointing at the fake) with its evidence; every Kubernetes experiment
loads, validates, and references functions that exist with matching arguments.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from chaoslib.experiment import ensure_experiment_is_valid
from chaoslib.loader import load_experiment
from click.testing import CliRunner
from fake_k8s import FakeK8s, make_cluster, write_target
from k8s_sim import ServiceProxy
from labutil import cli, write_k8s_plan

from chaoslib_infer.cli import main
from chaoslib_infer.load.ceiling import sim_engine

ROOT = Path(__file__).resolve().parent.parent
K8S_EXPERIMENTS = ROOT / "experiments" / "k8s"
DRILLS = sorted(p.stem for p in (ROOT / "experiments").glob("*.yaml"))


def _cli(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return cli(*args, timeout=timeout, env=env, inherit_env=False)


def _invoke(*args: str, env: dict[str, str]) -> Any:
    """The same command in-process (click's runner): exit code, stdout, stderr."""
    changed = {k: v for k, v in env.items() if os.environ.get(k) != v}
    gone = {k: None for k in os.environ if k not in env}
    r = CliRunner().invoke(main, list(args), env={**changed, **gone}, catch_exceptions=False)
    return SimpleNamespace(returncode=r.exit_code, stdout=r.stdout, stderr=r.stderr)


@pytest.fixture()
def cluster(tmp_path: Path) -> Iterator[tuple[FakeK8s, dict[str, str]]]:
    """The fake API with a 3-replica model Deployment; env with KUBECONFIG pointing at it."""
    with FakeK8s(schedule_delay_s=0.1, ready_delay_s=0.2) as fake:
        make_cluster(fake)
        kubeconfig = fake.write_kubeconfig(tmp_path / "kubeconfig")
        env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
        env.pop("CHAOS_INFER_ALLOW", None)
        yield fake, env


def _target(tmp_path: Path, kubeconfig: str, **fields: Any) -> Path:
    # no kubeconfig field: the client finds the fake through $KUBECONFIG, as a user's would
    path = write_target(tmp_path / "k8s-target.yaml", Path(kubeconfig), **fields)
    doc = yaml.safe_load(path.read_text())
    doc.pop("kubeconfig")
    path.write_text(yaml.safe_dump(doc))
    return path


# -- refusal and dry run: no API call ---------------------------------------------------------


def test_target_outside_allowlist_is_refused_before_any_api_call(
    tmp_path: Path, cluster: tuple[FakeK8s, dict[str, str]]
) -> None:
    fake, env = cluster
    target = _target(tmp_path, env["KUBECONFIG"], context="prod-eu-1")
    out = tmp_path / "out"
    for args in (
        ("drill", "run", "simultaneous-restarts", "--target", str(target), "--out", str(out)),
        ("gameday", "--target", str(target), "--out", str(out)),
        ("gameday", "--target", str(target), "--dry-run"),
    ):
        p = _invoke(*args, env=env)
        assert p.returncode == 2, (args, p.stdout, p.stderr)
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
        assert "context 'prod-eu-1' is not in the allowlist" in lines[0]
        assert "refusing to touch it" in lines[0]
    assert fake.requests == []
    assert not out.exists()


def test_dry_run_prints_the_k8s_plan_and_makes_no_api_call(
    tmp_path: Path, cluster: tuple[FakeK8s, dict[str, str]]
) -> None:
    fake, env = cluster
    target = _target(tmp_path, env["KUBECONFIG"], url="https://llm.example.com/v1")
    # the file's url is not allowed by the file itself (issue 13): the operator allows it
    refused = _invoke("gameday", "--target", str(target), "--dry-run", env=env)
    assert refused.returncode == 2 and "url https://llm.example.com/v1 is outside" in refused.stderr
    p = _invoke("gameday", "--target", str(target), "--dry-run",
                "--allow", "https://llm.example.com:443", env=env)  # fmt: skip
    assert p.returncode == 0, p.stderr
    text = p.stdout
    assert "gameday-k8s.yaml" in text and "kubernetes-gameday" in text
    assert "context kind-lab, namespace llm, pods app=vllm, container vllm" in text
    assert "traffic to https://llm.example.com/v1" in text
    for drill in DRILLS:
        assert f"- drill {drill}: " in text
    assert "action: start-observation" in text and "rollback: stop-observation" in text
    assert text.strip().endswith("dry run: nothing was started or changed")
    assert fake.requests == []


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ("gameday", str(ROOT / "drills" / "gameday.yaml")),
            "this plan runs against the local lab",
        ),
        (("drill", "run", "oom-kill", "--replicas", "2"), "--replicas and --engine apply to"),
        (("drill", "run", "no-such-drill"), "unknown drill 'no-such-drill'; known: network-jitter"),
    ],
)
def test_bad_k8s_invocations_are_one_line_exit_2(
    tmp_path: Path, cluster: tuple[FakeK8s, dict[str, str]], args: tuple[str, ...], message: str
) -> None:
    fake, env = cluster
    target = _target(tmp_path, env["KUBECONFIG"])
    p = _invoke(*args, "--target", str(target), "--dry-run", env=env)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert len(p.stderr.strip().splitlines()) == 1 and message in p.stderr, p.stderr
    assert fake.requests == []


def test_kubernetes_plan_without_target_file_is_refused(
    cluster: tuple[FakeK8s, dict[str, str]],
) -> None:
    _, env = cluster
    p = _invoke("gameday", str(ROOT / "drills" / "gameday-k8s.yaml"), "--dry-run", env=env)
    assert p.returncode == 2 and "give --target TARGET.yaml" in p.stderr, p.stderr
    p = _invoke(
        "gameday",
        str(ROOT / "drills" / "gameday-k8s.yaml"),
        "--target",
        "http://127.0.0.1:1",
        env=env,
    )
    assert p.returncode == 2 and "not a URL" in p.stderr, p.stderr


# -- one drill end to end -----------------------------------------------------------------------


@pytest.mark.slow  # ~25 s: out of the fast tier
def test_drill_run_simultaneous_restarts_on_the_fake_cluster(
    tmp_path: Path, cluster: tuple[FakeK8s, dict[str, str]]
) -> None:
    fake, env = cluster
    # a baseline of >= 50 requests (docs/definitions.md, "Verdicts")
    drill_vars = {"load_warmup_s": 5, "window_s": 3, "load_rate_rps": 12}
    plan = write_k8s_plan(tmp_path / "plan.yaml", "simultaneous-restarts", drill_vars)
    before = sorted(p["metadata"]["name"] for p in fake.pods("llm", "app=vllm"))
    out = tmp_path / "out"
    # the url is the Service's data path: the pods' answers name them (X-Replica-Id), so the
    # traffic can confirm the fault (verdict/confirm.py); tests/test_k8s_drills_e2e.py has the
    # url that misses the pods
    with (
        sim_engine(zero_latency=False, itl_s=0.002, output_tokens=8) as engine,
        ServiceProxy(fake, "llm", "vllm", engine) as svc,
    ):
        target = _target(tmp_path, env["KUBECONFIG"], url=svc.url + "/v1", service="vllm")
        p = _cli(
            "drill", "run", "simultaneous-restarts", "--target", str(target), "--out", str(out),
            env={**env, "CHAOS_INFER_K8S_PLAN": str(plan)},
        )  # fmt: skip
    assert "Traceback" not in p.stdout + p.stderr, p.stdout + p.stderr
    assert p.returncode == 0, p.stdout + p.stderr
    # the fake saw the two DELETEs, at once, with no grace period, and the controller replaced them
    deletes = fake.calls("DELETE", "/pods/")
    assert sorted(r.path for r in deletes) == [
        f"/api/v1/namespaces/llm/pods/{name}" for name in before[:2]
    ]
    assert all(r.query.get("gracePeriodSeconds") == "0" for r in deletes)
    after = {p["metadata"]["name"] for p in fake.pods("llm", "app=vllm")}
    assert len(after) == 3 and not after & set(before[:2])
    # evidence: the client's figures, lab-only ground truth omitted with its reason
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] is True
    assert summary["target"]["kind"] == "kubernetes"
    assert summary["target"]["namespace"] == "llm"
    (drill,) = summary["drills"]
    assert drill["status"] == "passed"
    assert drill["hypothesis"] == {"before": True, "after": True}
    figures = drill["figures"]
    assert figures["requests"] > 20 and figures["availability"] == 1.0
    assert figures["duplicates"] is None  # no engine ledger on a cluster: unmeasured, never 0
    # judged from the API's own record of the fault: deleted pods, their recovery
    # ... confirmed by the traffic: the deleted pods had served, then served no more
    note = drill["verdict"]["notes"][0]
    assert note.startswith("fault: 2 pods deleted at once (the API's own record); "), note
    felt = note.split("the traffic felt it: ", 1)[-1]
    assert "the traffic felt it: " in note and all(pod in felt for pod in before[:2]), note
    assert "moved (share of answers" in note, note
    rows = {r["criterion"]: r for r in drill["verdict"]["rows"]}
    assert rows["all_serving_s"]["result"] == "pass"
    assert rows["all_serving_s"]["value"] == figures["k8s_recovery_total_s_max"]
    assert drill["ground_truth"]["lab_only_figures"].startswith("omitted on a Kubernetes target")
    evidence = (out / "simultaneous-restarts" / "evidence.md").read_text()
    assert "omitted on a Kubernetes target" in evidence
    assert (out / "simultaneous-restarts" / "timeline.png").stat().st_size > 1000
    faults = [
        json.loads(line)
        for line in (out / "simultaneous-restarts" / "faults.jsonl").read_text().splitlines()
    ]
    (restarts,) = [f for f in faults if f["kind"] == "k8s-simultaneous-restarts"]
    assert sorted(restarts["pods"]) == before[:2]
    journal = json.loads((out / "simultaneous-restarts" / "journal.json").read_text())
    assert [r["activity"]["name"] for r in journal["rollbacks"]] == ["stop-observation"]


# -- every Kubernetes experiment is valid and references real functions -------------------------


def _providers(experiment: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for probe in (experiment.get("steady-state-hypothesis") or {}).get("probes") or []:
        yield probe["name"], probe["provider"]
    for section in ("method", "rollbacks"):
        for act in experiment.get(section) or []:
            yield act["name"], act["provider"]
    for control in experiment.get("controls") or []:
        yield control["name"], control["provider"]


def _problems(path: Path) -> list[str]:
    """Each provider whose module/function is missing or whose arguments do not bind, named."""
    out = []
    exp = yaml.safe_load(path.read_text())
    for name, prov in _providers(exp):
        mod_name, func = prov["module"], prov.get("func")
        try:
            module = importlib.import_module(mod_name)
        except ImportError:
            out.append(f"{path.name}: {name}: module {mod_name} is missing (wants {func})")
            continue
        if func is None:  # a control module
            continue
        fn = getattr(module, func, None)
        if fn is None or func not in getattr(module, "__all__", [func]):
            out.append(f"{path.name}: {name}: {mod_name}.{func} is missing (or not in __all__)")
            continue
        params = inspect.signature(fn).parameters
        args = set(prov.get("arguments") or {})
        unknown = sorted(a for a in args if a not in params)
        required = sorted(
            p
            for p, v in params.items()
            if v.default is inspect.Parameter.empty
            and v.kind not in (v.VAR_KEYWORD, v.VAR_POSITIONAL)
            and p not in args | {"configuration", "secrets"}
        )
        if unknown or required:
            out.append(
                f"{path.name}: {name}: {mod_name}.{func}: unknown argument(s) {unknown}, "
                f"missing required {required}"
            )
    return out


def test_every_lab_drill_has_a_kubernetes_experiment_of_the_same_shape() -> None:
    assert sorted(p.stem for p in K8S_EXPERIMENTS.glob("*.yaml")) == DRILLS
    plan = yaml.safe_load((ROOT / "drills" / "gameday-k8s.yaml").read_text())
    assert plan["platform"] == "kubernetes" and "lab" not in plan
    assert [d["name"] for d in plan["drills"]] == [
        d["name"] for d in yaml.safe_load((ROOT / "drills" / "gameday.yaml").read_text())["drills"]
    ]
    for path in sorted(K8S_EXPERIMENTS.glob("*.yaml")):
        exp = yaml.safe_load(path.read_text())
        assert exp["runtime"] == {"rollbacks": {"strategy": "always"}}, path.name
        cfg = exp["configuration"]
        assert cfg["infer_k8s_target"]["key"] == "CHAOS_INFER_K8S_TARGET", path.name
        assert "infer_lab_dir" not in cfg, path.name  # nothing here may need the lab
        assert [c["provider"]["module"] for c in exp["controls"]] == [
            "chaoslib_infer.controls.load"
        ]
        probes = exp["steady-state-hypothesis"]["probes"]
        slo = [p for p in probes if p["provider"]["func"] == "slo_check"]
        assert {p["provider"]["arguments"]["metric"] for p in slo} == {
            "availability", "error_rate", "timeout_rate", "p50_e2e_s", "p99_e2e_s"
        }  # fmt: skip
        # and the drill's own fault-window criteria, so `chaos run` deviates on them too
        assert probes[-1]["name"] == "drill-criteria-hold", path.name
        assert probes[-1]["provider"]["arguments"] == {"drill": path.stem}, path.name
        assert exp["method"][0]["provider"]["func"] == "k8s_start_observation", path.name
        assert exp["rollbacks"][-1]["provider"]["func"] == "k8s_stop_observation", path.name
        modules = {act["provider"]["module"] for s in ("method", "rollbacks") for act in exp[s]}
        # each drill's actions from its own room; the activities.k8s facade is for old experiments
        room = f"chaoslib_infer.drills.{path.stem.replace('-', '_')}.k8s"
        assert modules <= {room, "chaoslib_infer.activities.k8s_observe"}, (path.name, modules)


def test_every_kubernetes_experiment_validates_and_its_functions_exist() -> None:
    paths = sorted(K8S_EXPERIMENTS.glob("*.yaml")) + sorted(K8S_EXPERIMENTS.glob("variants/*.yaml"))
    assert len(paths) == len(DRILLS) + 2
    problems = [line for p in paths for line in _problems(p)]
    assert problems == [], "\n".join(problems)
    for path in paths:
        ensure_experiment_is_valid(load_experiment(str(path), settings={}))


@pytest.mark.parametrize(
    "variant, action, rollback",
    [
        ("taint", "k8s_taint_model_node", "k8s_remove_node_taint"),
        ("delete", "k8s_delete_model_node", "k8s_restore_node"),
    ],
)
def test_node_loss_drains_by_default_and_its_variants_differ_only_in_the_fault(
    variant: str, action: str, rollback: str
) -> None:
    """The default node-loss drains (Eviction API); the opt-in variants are the same experiment
    (hypothesis, load, observation, configuration) with their own action and rollback only."""
    default = yaml.safe_load((K8S_EXPERIMENTS / "node-loss.yaml").read_text())
    other = yaml.safe_load((K8S_EXPERIMENTS / "variants" / f"node-loss-{variant}.yaml").read_text())

    def funcs(exp: dict[str, Any], section: str) -> list[str]:
        return [a["provider"]["func"] for a in exp[section]]

    assert funcs(default, "method")[1] == "k8s_drain_model_node"
    assert funcs(default, "rollbacks") == ["k8s_uncordon_node", "k8s_stop_observation"]
    assert "drained through the Eviction API" in default["title"]
    assert funcs(other, "method")[1] == action
    assert funcs(other, "rollbacks") == [rollback, "k8s_stop_observation"]
    assert f"{variant} variant" in other["title"]
    assert default["method"][1]["provider"]["arguments"] == other["method"][1]["provider"][
        "arguments"
    ] == {"allow_bystanders": "${allow_bystanders}"}  # fmt: skip
    for exp in (default, other):
        exp.pop("title"), exp.pop("description")
        del exp["method"][1], exp["rollbacks"][0]
    assert default == other


def test_problem_finder_names_a_missing_function(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        yaml.safe_dump(
            {
                "method": [
                    {
                        "name": "x",
                        "provider": {
                            "module": "chaoslib_infer.activities.k8s",
                            "func": "k8s_no_such_action",
                        },
                    },
                    {
                        "name": "y",
                        "provider": {
                            "module": "chaoslib_infer.activities.k8s",
                            "func": "k8s_cut_quota",
                            "arguments": {"gpu": 1},
                        },
                    },
                ]
            }
        )
    )
    assert _problems(bad) == [
        "bad.yaml: x: chaoslib_infer.activities.k8s.k8s_no_such_action is missing (or not in __all__)",
        "bad.yaml: y: chaoslib_infer.activities.k8s.k8s_cut_quota: unknown argument(s) ['gpu'], "
        "missing required []",
    ]
