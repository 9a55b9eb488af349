"""The drills' tools on the shipped topology (issue 11, deliverable 7).

* Engine fault modes armed and cleared on a lab whose replicas listen on node addresses (network
  namespaces, as ``drills/gameday.yaml`` has them): through the lab's admin token, from an
  experiment run from a plan, undone by its rollback, shown by ``chaos-infer lab status``.
* ``chaos-infer lab up`` takes every option a plan's ``lab:`` block has.
* The background-load control takes a prompt-length mix and the client's first-token and idle
  timeouts, and refuses bad ones with one line.

One lab for the whole module (brought up with ``lab up --plan`` and every lab option), so the lab
tests stay few and short; the unit tests need no lab.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import json
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from chaoslib.exceptions import ActivityFailed, InterruptExecution
from click.testing import CliRunner
from labutil import cli as chaos_infer

from chaoslib_infer import cli
from chaoslib_infer.activities import engine_faults as ef
from chaoslib_infer.controls import load as load_control
from chaoslib_infer.lab.engine import ADMIN_TOKEN_HEADER, EngineConfig, admin_allowed, build_app
from chaoslib_infer.lab.fleet import Lab, LabError
from chaoslib_infer.load.client import LoadSpec, build_body
from chaoslib_infer.load.mix import MIX_CLASSES, format_mix, parse_prompt_mix
from chaoslib_infer.plan import load_plan

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENT = ROOT / "experiments" / "tools" / "engine-fault.yaml"
TOKEN = "t" * 32


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return chaos_infer(*args, timeout=timeout)


# ---------------------------------------------------------------------------- engine: who may arm


def test_admin_token_policy() -> None:
    tokened = EngineConfig(admin_token=TOKEN)
    plain = EngineConfig()
    node_peer, loopback = ("10.213.7.1", 40000), ("127.0.0.1", 40000)
    assert admin_allowed(tokened, node_peer, TOKEN) is None
    assert admin_allowed(tokened, loopback, TOKEN) is None
    # with a token, loopback is not enough, and a wrong token is refused (never echoed)
    assert "no X-Chaos-Admin-Token" in (admin_allowed(tokened, loopback, None) or "")
    wrong = admin_allowed(tokened, node_peer, "x" * 32) or ""
    assert "wrong" in wrong and "x" * 32 not in wrong and TOKEN not in wrong
    # without one: loopback peers only, as before
    assert admin_allowed(plain, loopback, None) is None
    assert "loopback" in (admin_allowed(plain, node_peer, TOKEN) or "")
    assert TOKEN not in repr(tokened)


def test_token_guards_admin_endpoint_and_fault_header_in_process() -> None:
    async def main() -> None:
        app = build_app(
            EngineConfig(load_delay_s=0.0, warmup_requests=0, itl_s=0.0, admin_token=TOKEN)
        )
        transport = httpx.ASGITransport(app=app)  # peer 127.0.0.1
        good = {ADMIN_TOKEN_HEADER: TOKEN}
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        async with httpx.AsyncClient(transport=transport, base_url="http://e") as c:
            assert (await c.get("/admin/faults")).status_code == 403
            assert (await c.post("/admin/faults", json={"mode": "empty"})).status_code == 403
            r = await c.post("/admin/faults", json={"mode": "empty"}, headers=good)
            assert r.status_code == 200 and r.json()["fault"]["mode"] == "empty"
            r = await c.delete("/admin/faults", headers=good)
            assert [f["mode"] for f in r.json()["cleared"]] == ["empty"]
            # the per-request header is fault injection too: it needs the token
            hdr = {"X-Chaos-Fault": "empty"}
            r = await c.post("/v1/chat/completions", json=body, headers=hdr)
            assert r.status_code == 403 and "admin token" in r.json()["error"]["message"]
            r = await c.post("/v1/chat/completions", json=body, headers={**hdr, **good})
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == ""
            r = await c.post("/v1/chat/completions", json=body)
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]

    asyncio.run(main())


def test_engine_token_file_is_checked(tmp_path: Path) -> None:
    short = tmp_path / "short"
    short.write_text("abc\n")
    base = [sys.executable, "-m", "chaoslib_infer.lab.engine", "--port", "0"]
    for path, msg in ((short, "16+ characters"), (tmp_path / "missing", "cannot read it")):
        proc = subprocess.run(
            [*base, "--admin-token-file", str(path)], capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 2 and msg in proc.stderr and "Traceback" not in proc.stderr


def test_lab_refuses_bad_engine_args_before_starting(tmp_path: Path) -> None:
    for args, msg in (
        ({"bogus_flag": 1}, "unrecognized arguments: --bogus-flag 1"),
        ({"max_num_seqs": 0}, "max_num_seqs must be >= 1"),
        ({"port": 9}, "'port' is set by the lab"),
        ({"admin_token_file": "/x"}, "'admin_token_file' is set by the lab"),
    ):
        with pytest.raises(LabError, match=msg):
            Lab.up(tmp_path / "lab", engine_args=args)
    assert not (tmp_path / "lab" / "lab.json").exists()  # nothing was started


def test_set_engine_fault_arguments() -> None:
    assert ef._params(None) == ef._params("") == {}
    assert ef._params("k=2;t=8.5") == ef._params("k=2, t=8.5") == {"k": 2, "t": 8.5}
    assert ef._params("how=bytes") == {"how": "bytes"}
    assert ef._params('{"k": 2}') == {"k": 2} and ef._params({"n": 64}) == {"n": 64}
    for bad in ("k", "[1]", 3, "{bad json"):
        with pytest.raises(ActivityFailed, match="params must be"):
            ef._params(bad)
    conf = {"infer_lab_dir": "/nonexistent-lab"}
    with pytest.raises(ActivityFailed, match="ttl_s must be"):
        ef.set_engine_fault("hang", ttl_s="soon", configuration=conf)
    with pytest.raises(ActivityFailed, match="ttl_s must be > 0"):
        ef.set_engine_fault("hang", ttl_s=-1, configuration=conf)
    with pytest.raises(ActivityFailed, match="probability must be"):
        ef.set_engine_fault("hang", probability="x", configuration=conf)


def test_describe_engine_fault() -> None:
    line = cli.describe_engine_fault(
        {"id": "ab12", "mode": "stall", "k": 2, "t": 8.0, "probability": 0.5, "expires_in_s": 3.21}
    )
    assert line == "stall k=2 t=8.0 probability=0.5 (expires in 3.2 s, id ab12)"
    assert cli.describe_engine_fault({"id": "c", "mode": "hang", "probability": 1.0}) == (
        "hang (until cleared, id c)"
    )


# ---------------------------------------------------------------------------- experiment and plans


def test_engine_fault_experiment_and_plans_are_well_formed() -> None:
    from chaoslib.experiment import ensure_experiment_is_valid

    exp = yaml.safe_load(EXPERIMENT.read_text())
    ensure_experiment_is_valid(exp)
    assert exp["runtime"] == {"rollbacks": {"strategy": "always"}}
    providers = [
        *(a["provider"] for a in exp["method"] + exp["rollbacks"]),
        *(p["provider"] for p in exp["steady-state-hypothesis"]["probes"]),
    ]
    for prov in providers:  # every argument binds to the function it names
        fn = getattr(__import__(prov["module"], fromlist=["_"]), prov["func"])
        inspect.signature(fn).bind_partial(**(prov.get("arguments") or {}))
    control = exp["controls"][0]["provider"]["arguments"]
    assert set(control) <= set(inspect.signature(load_control.start_load).parameters)
    # the shipped plan: the default game day's lab, vars the experiment declares
    plan = load_plan(ROOT / "drills" / "engine-faults.yaml")
    gameday = load_plan(ROOT / "drills" / "gameday.yaml")
    assert plan.lab == gameday.lab and plan.lab.options["nodes"] == 3
    for drill in plan.drills:
        assert drill.experiment == EXPERIMENT
        assert set(drill.vars) <= set(exp["configuration"]), drill.name
    # a drill/experiment listing must not pick the tool up as an eighth drill
    assert "engine-fault" not in {p.stem for p in (ROOT / "experiments").glob("*.yaml")}


# ---------------------------------------------------------------------------- prompt mix, timeouts


def test_prompt_mix_parsing() -> None:
    mix = parse_prompt_mix("short:70,mid:25,long:5")
    assert [(c.name, c.prompt_words, c.max_tokens, c.weight) for c in mix] == [
        (n, *MIX_CLASSES[n], w) for n, w in (("short", 70.0), ("mid", 25.0), ("long", 5.0))
    ]
    words = parse_prompt_mix({"64": 80, "2048": 20})
    assert [(c.prompt_words, c.max_tokens) for c in words] == [(64, None), (2048, None)]
    assert parse_prompt_mix([["short", 1], ["900", 2]]) == parse_prompt_mix("short:1,900:2")
    assert format_mix(parse_prompt_mix("short:70,64:0.25")) == "short:70,64:0.25"
    assert parse_prompt_mix(mix) == mix
    for bad, msg in (
        ("", "empty"),
        ("huge:5", "unknown class 'huge'"),
        ("short:0", "must be a number > 0"),
        ("short:x", "bad weight"),
        ("short", "expected CLASS:WEIGHT"),
        ("short:1,short:2", "given twice"),
        ("99999999:1", "unknown class"),
        (7, "must be 'CLASS:WEIGHT"),
    ):
        with pytest.raises(ValueError, match=msg):
            parse_prompt_mix(bad)


def test_build_body_draws_the_mix() -> None:
    spec = LoadSpec(
        url="http://127.0.0.1:1", max_tokens=7, prompt_mix=parse_prompt_mix("3:1,long:1")
    )
    rng = random.Random(1)
    bodies = [build_body(spec, rng) for _ in range(400)]
    lengths = [len(b["messages"][0]["content"].split()) - 1 for b in bodies]  # minus the nonce
    assert set(lengths) == {3, 2048}
    assert 150 < lengths.count(2048) < 250
    # a word-count class keeps the load's max_tokens; a named class sets its own
    assert {(n, b["max_tokens"]) for n, b in zip(lengths, bodies, strict=True)} == {
        (3, 7),
        (2048, MIX_CLASSES["long"][1]),
    }
    with pytest.raises(ValueError, match="prompt mix"):
        LoadSpec(url="http://127.0.0.1:1", prompt_mix=(("x", 1),))  # type: ignore[arg-type]


def test_load_control_refuses_bad_mix_timeouts_and_unknown_arguments(tmp_path: Path) -> None:
    conf = {"infer_run_dir": str(tmp_path), "infer_base_url": "http://127.0.0.1:9"}
    for kwargs, msg in (
        # one line naming the setting (docs/definitions.md, "Load settings")
        ({"prompt_mix": "huge:1"}, "background-load: load_prompt_mix: .*unknown class 'huge'"),
        ({"ttft_timeout_s": -1}, "background-load: load_ttft_timeout_s: expected a number of"),
        ({"idle_timeout_s": "soon"}, "background-load: load_idle_timeout_s: expected a number"),
    ):
        with pytest.raises(InterruptExecution, match=msg) as err:
            load_control.start_load(configuration=conf, **kwargs)
        assert "\n" not in str(err.value)
    with pytest.raises(InterruptExecution, match="unknown argument.*ttft_timeout\\b"):
        load_control.before_experiment_control({}, configuration=conf, ttft_timeout=1)
    assert "ttft_timeout" in (tmp_path / load_control.LOAD_ERROR_FILE).read_text()
    assert list(tmp_path.glob("load.pid")) == []  # nothing was started
    proc = subprocess.run(
        [sys.executable, "-m", "chaoslib_infer.load", "--url", "http://127.0.0.1:9", "--rate",
         "1", "--duration-s", "1", "--out", str(tmp_path / "r.jsonl"), "--prompt-mix", "x:1"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--prompt-mix" in proc.stderr


# ---------------------------------------------------------------------------- lab up options


def test_lab_up_has_an_option_for_every_lab_field() -> None:
    params = set(inspect.signature(Lab.up).parameters) - {"cls", "state_dir"}
    options = {p.name for p in cli.lab_up.params}
    assert params - {"engine_args"} <= options, params - options
    assert "engine_arg" in options and "plan_path" in options


def test_lab_up_merges_plan_and_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    class _Up:
        url = "http://127.0.0.1:1"

    def fake_up(cls: type, state_dir: Path, **kwargs: Any) -> _Up:
        seen.clear()
        seen.update(kwargs)
        return _Up()

    fake_up.__wrapped__ = Lab.up.__func__  # type: ignore[attr-defined]  # plan.py reads its signature
    monkeypatch.setattr(Lab, "up", classmethod(fake_up))
    runner = CliRunner()
    base = ["lab", "up", "--state-dir", str(tmp_path / "lab")]
    res = runner.invoke(
        cli.main,
        [*base, "--plan", str(ROOT / "drills" / "gameday.yaml"), "--replicas", "2",
         "--engine-arg", "itl_s=0.01", "--engine-arg", "zero-latency=true"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert seen == {
        "replicas": 2,  # the command line wins
        "engine": "sim",
        "memory_limit_mb": 512,
        "nodes": 3,
        "standby": 1,
        "autoscale": True,
        "gateway_retry": True,
        "engine_args": {"max_num_seqs": 4, "itl_s": 0.01, "zero_latency": True},
        "port": 8800,
        "spare_node": True,
        "scale_out_queue": 4.0,
        "scale_out_after_s": 1.0,
        "scale_out_cooldown_s": 10.0,
        "ready_timeout_s": 60.0,
        "gateway": "haproxy",  # the default gateway (issue 14)
        "gateway_config": None,
    }
    res = runner.invoke(cli.main, [*base, "--plan", str(ROOT / "drills" / "gameday.yaml"),
                                   "--no-autoscale", "--nodes", "0"])  # fmt: skip
    assert res.exit_code == 0 and seen["autoscale"] is False and seen["nodes"] == 0
    assert "spare_node" not in seen
    for args, msg in (
        (["--engine-arg", "nokey"], "expected KEY=VALUE"),
        (["--engine-arg", "a={b: 1}"], "VALUE must be a number"),
        (["--plan", str(ROOT / "drills" / "gameday-k8s.yaml")], "has no lab"),
        (["--plan", str(tmp_path / "none.yaml")], "cannot read plan"),
    ):
        res = runner.invoke(cli.main, [*base, *args])
        assert res.exit_code == 2 and msg in res.output, (args, res.output)
        assert "Traceback" not in res.output


# ---------------------------------------------------------------------------- on a real node lab

#: a plan whose lab: block uses every lab option (what `lab up --plan` must accept)
EVERY_OPTION_LAB: dict[str, Any] = {
    "replicas": 2,
    "engine": "sim",
    "memory_limit_mb": 256,
    "port": 0,
    "nodes": 2,
    "spare_node": False,
    "standby": 1,
    "autoscale": True,
    "scale_out_queue": 500.0,  # never reached by these tests' load: no scale-out mid-test
    "scale_out_after_s": 2.0,
    "scale_out_cooldown_s": 30.0,
    "gateway_retry": True,
    "ready_timeout_s": 30.0,
    "engine_args": {"load_delay_s": 0.3, "warmup_requests": 0, "itl_s": 0.01, "max_num_seqs": 8},
}


@pytest.fixture(scope="module")
def node_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """One lab for the module, brought up by `chaos-infer lab up --plan` with every lab option."""
    root = tmp_path_factory.mktemp("drill-tools")
    plan = root / "plan.yaml"
    plan.write_text(
        yaml.safe_dump(
            {
                "name": "every-option",
                "lab": EVERY_OPTION_LAB,
                "drills": [{"name": "hang", "experiment": str(EXPERIMENT)}],
            }
        )
    )
    state_dir = root / "lab"
    up = _cli("lab", "up", "--plan", str(plan), "--state-dir", str(state_dir))
    try:
        assert up.returncode == 0, up.stderr
        lab = Lab.attach(state_dir)
        lab.meta["_up_stdout"] = up.stdout
        yield lab
    finally:
        down = _cli("lab", "down", "--state-dir", str(state_dir))
        assert down.returncode == 0, down.stderr


@pytest.mark.lab
def test_lab_up_with_every_plan_option(node_lab: Lab) -> None:
    meta = node_lab.meta
    assert "2 x sim on 2 node(s)" in meta["_up_stdout"]
    assert [n["name"] for n in meta["nodes"]] == ["n0", "n1"]  # spare_node: false
    assert [(r["name"], bool(r.get("standby"))) for r in meta["replicas"]] == [
        ("r0", False), ("r1", False), ("r2", True)
    ]  # fmt: skip
    assert meta["scaling"]["autoscale"] is True and meta["scaling"]["scale_out_queue"] == 500.0
    assert meta["scaling"]["scale_out_after_s"] == 2.0
    assert meta["scaling"]["scale_out_cooldown_s"] == 30.0
    assert meta["gateway_retry"] is True and meta["memory_limit_bytes"] == 256 << 20
    assert meta["engine_args"] == EVERY_OPTION_LAB["engine_args"]
    assert meta["port"] != 8800  # port: 0 picked a free one
    # replicas listen on node addresses, where a caller is not loopback
    assert {node_lab.replica_host(n) for n in node_lab.replica_names()} <= {
        n["ip"] for n in meta["nodes"]
    }
    # the token lives in the 0700 state directory, 0600, and never on a command line
    sd = node_lab.state_dir
    assert (sd.stat().st_mode & 0o777) == 0o700
    assert ((sd / "admin-token").stat().st_mode & 0o777) == 0o600
    token = node_lab.admin_token()
    assert token and len(token) >= 32
    for pid in (meta.get("pids", {}).get("replicas") or {}).values():
        assert token not in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    # without the token a replica refuses fault injection, from any peer
    rep = meta["replicas"][0]
    url = f"http://{node_lab.replica_host('r0')}:{rep['port']}/admin/faults"
    assert httpx.get(url, timeout=3).status_code == 403
    assert httpx.get(url, headers={ADMIN_TOKEN_HEADER: token}, timeout=3).status_code == 200


def _run_from_plan(
    lab: Lab, run_dir: Path, drill_vars: dict[str, Any], keep_method_clear: bool = True
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run the engine-fault experiment as a plan's drill (vars merged as the game day merges
    them), in-process; meanwhile poll ``lab status`` (JSON and text) from a thread.

    The steady-state hypothesis is left out: this module tests the tools, the verdict tests judge
    the hypotheses. Returns the journal and the status snapshots taken while a fault was armed.
    """
    from chaoslib.experiment import run_experiment

    plan_file = run_dir.parent / f"{run_dir.name}-plan.yaml"
    plan_file.write_text(
        yaml.safe_dump(
            {
                "name": "engine-faults",
                "lab": {"replicas": 2},
                "drills": [
                    {"name": run_dir.name, "experiment": str(EXPERIMENT), "vars": drill_vars}
                ],
            }
        )
    )
    drill = load_plan(plan_file).drills[0]
    experiment = yaml.safe_load(drill.experiment.read_text())
    experiment.pop("steady-state-hypothesis")
    if not keep_method_clear:  # only the rollback clears it
        experiment["method"] = [
            a for a in experiment["method"] if a["name"] != "clear-engine-fault"
        ]
        experiment["method"][-1]["pauses"] = {"after": drill_vars["hold_s"]}
    run_dir.mkdir(parents=True)
    config_vars = {
        "infer_run_dir": str(run_dir),
        "infer_base_url": "",
        "infer_lab_dir": str(lab.state_dir),
        **drill.vars,
    }
    seen: list[dict[str, Any]] = []
    done = threading.Event()

    def watch() -> None:
        deadline = time.monotonic() + 60
        while not done.is_set() and time.monotonic() < deadline:
            status = lab.status()
            armed = {
                r["name"]: r["engine_faults"] for r in status["replicas"] if r["engine_faults"]
            }
            if armed and not seen:
                text = _cli("lab", "status", "--state-dir", str(lab.state_dir)).stdout
                seen.append({"armed": armed, "ledger": status["active_faults"], "text": text})
            time.sleep(0.2)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        journal = dict(
            run_experiment(
                copy.deepcopy(experiment),
                settings={"runtime": experiment["runtime"]},
                experiment_vars=(config_vars, {}),
            )
        )
    finally:
        load_control.stop_load({"infer_run_dir": str(run_dir)})
        done.set()
        watcher.join()
    return journal, seen


def _records(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "records.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def _e2e(record: dict[str, Any]) -> float:
    return float(record["end_at"]) - float(record["sent_at"])


def _sabotaged(lab: Lab, mode: str) -> set[str]:
    lines = (lab.state_dir / "ledger.jsonl").read_text().splitlines()
    return {
        e["request_id"]
        for e in map(json.loads, lines)
        if e.get("event") == "fault" and e.get("mode") == mode
    }


def _engine_fault_events(lab: Lab) -> list[tuple[str, str | None, str | None]]:
    return [
        (e["phase"], e.get("replica"), e.get("mode"))
        for e in lab.events()
        if e.get("event") == "fault" and e.get("kind") == "engine-fault"
    ]


LOAD_VARS = {"load_rate_rps": 8, "load_warmup_s": 2, "load_max_duration_s": 60, "settle_s": 1}


@pytest.mark.lab
def test_hang_from_a_plan_on_a_node_replica_takes_effect_and_is_cleared(
    node_lab: Lab, tmp_path: Path
) -> None:
    """hang on r0 (a node address): requests routed to it never get a first token, so the load
    control's ttft_timeout_s (1.5 s, from the plan's vars) cuts them; lab status lists the armed
    fault; the method's clear and the rollbacks leave nothing armed and nothing in the ledger."""
    events_before = len(_engine_fault_events(node_lab))
    run_dir = tmp_path / "engine-hang"
    journal, seen = _run_from_plan(
        node_lab,
        run_dir,
        {**LOAD_VARS, "engine_fault_mode": "hang", "engine_fault_replica": "r0", "hold_s": 4,
         "load_ttft_timeout_s": 1.5, "engine_fault_ttl_s": 60},
    )  # fmt: skip
    assert journal["status"] == "completed", journal.get("run")
    assert [r["status"] for r in journal["rollbacks"]] == ["succeeded", "succeeded"]
    # lab status saw it while armed: the engine's own list, the ledger record, the text line
    assert seen, "lab status never showed the armed fault"
    assert [f["mode"] for f in seen[0]["armed"]["r0"]] == ["hang"] and set(seen[0]["armed"]) == {
        "r0"
    }
    assert [(f["kind"], f["replica"], f["mode"]) for f in seen[0]["ledger"]] == [
        ("engine-fault", "r0", "hang")
    ]
    assert "engine fault armed: hang (expires in" in seen[0]["text"]
    assert "engine faults armed: 1" in seen[0]["text"]
    # it took effect: the engine sabotaged requests, the client recorded them as first-token
    # timeouts at its 1.5 s limit (one still hanging at the clear gets the release 503, which
    # the retrying gateway may redispatch to r1, where it succeeds)
    hung_ids = _sabotaged(node_lab, "hang")
    records = _records(run_dir)
    hung = [r for r in records if r["request_id"] in hung_ids]
    assert hung, "no request reached the hung replica"
    failed = {r["error_class"] for r in hung if not r["ok"]}
    assert failed <= {"timeout_ttft", "http_5xx", "cut_off"}, hung
    ttft_cut = [r for r in hung if r["error_class"] == "timeout_ttft"]
    assert ttft_cut and all(1.4 <= _e2e(r) < 3.0 for r in ttft_cut), ttft_cut
    assert any(r["ok"] for r in records)  # the other replica served
    # cleared: the engine has nothing armed, the ledger is empty, ground truth has both events
    status = node_lab.status()
    assert all(r["engine_faults"] == [] for r in status["replicas"]), status["replicas"]
    assert status["active_faults"] == []
    assert _engine_fault_events(node_lab)[events_before:] == [
        ("injected", "r0", "hang"),
        ("cleared", "r0", None),
    ]
    logged = [json.loads(ln) for ln in (run_dir / "faults.jsonl").read_text().splitlines()]
    assert [(f["phase"], f["replica"]) for f in logged][:1] == [("set", "r0")]


@pytest.mark.lab
def test_stall_cleared_by_the_rollback_with_a_prompt_mix_and_idle_timeout(
    node_lab: Lab, tmp_path: Path
) -> None:
    """stall on r1 with t above the control's idle_timeout_s: the client records timeout_idle;
    the method never clears it, the experiment's rollback does. The load sends the prompt mix
    (the engine's prompt-token counter shows the long class)."""
    token = node_lab.admin_token()
    metrics_before = _prompt_tokens(node_lab, token)
    run_dir = tmp_path / "engine-stall"
    journal, seen = _run_from_plan(
        node_lab,
        run_dir,
        {**LOAD_VARS, "engine_fault_mode": "stall", "engine_fault_replica": "r1",
         "engine_fault_params": "k=2;t=3", "hold_s": 3, "load_idle_timeout_s": 1,
         "load_ttft_timeout_s": 5, "load_prompt_mix": "8:1,1024:1"},
        keep_method_clear=False,
    )  # fmt: skip
    assert journal["status"] == "completed", journal.get("run")
    assert "clear-engine-fault" not in [r["activity"]["name"] for r in journal["run"]]
    assert [r["status"] for r in journal["rollbacks"]] == ["succeeded", "succeeded"]
    assert seen and [f["mode"] for f in seen[0]["armed"]["r1"]] == ["stall"]
    assert seen[0]["armed"]["r1"][0]["t"] == 3.0
    stalled = [r for r in _records(run_dir) if r["request_id"] in _sabotaged(node_lab, "stall")]
    assert stalled and any(r["error_class"] == "timeout_idle" for r in stalled), stalled
    for r in stalled:
        if r["error_class"] == "timeout_idle":  # cut at the 1 s idle limit, not the 3 s stall
            assert _e2e(r) < 2.9, r
    # the rollback disarmed it on the engine and forgot the ledger record
    status = node_lab.status()
    assert all(r["engine_faults"] == [] for r in status["replicas"]) and not status["active_faults"]
    assert _engine_fault_events(node_lab)[-2:] == [
        ("injected", "r1", "stall"),
        ("cleared", "r1", None),
    ]
    # the prompt mix reached the engines: half the prompts are ~1024 words (~1500 tokens)
    sent = [r for r in _records(run_dir) if r.get("attempt", 1) == 1]
    grown = _prompt_tokens(node_lab, token) - metrics_before
    assert sent and grown / len(sent) > 300, (grown, len(sent))


@pytest.mark.lab
def test_a_garbling_replica_the_gateway_never_ejects_is_not_mitigated(
    node_lab: Lab, tmp_path: Path
) -> None:
    """garbled on r0, every answer (issue 29): HAProxy's health checks see r0 UP (its health
    endpoint and its 200s are fine) and the client does not retry a garbled answer, so nothing
    mitigates it: from the engine fault's mitigation time (5 s after the arming) to its clear,
    r0's share of the requests fails garbled. The verdict reads FAILED "not mitigated", the
    class named with its count, which the engine's own ledger confirms (the requests it
    sabotaged in that window)."""
    from chaoslib_infer.evidence.figures import drill_figures, read_jsonl
    from chaoslib_infer.verdict import DrillFacts, judge_drill
    from chaoslib_infer.verdict.mitigation import ENGINE_FAULT_MITIGATION_S

    run_dir = tmp_path / "engine-garbled"
    journal, _seen = _run_from_plan(
        node_lab,
        run_dir,
        {**LOAD_VARS, "engine_fault_mode": "garbled", "engine_fault_replica": "r0",
         "hold_s": 12, "load_warmup_s": 8, "engine_fault_ttl_s": 60},
    )  # fmt: skip
    assert journal["status"] == "completed", journal.get("run")
    events = node_lab.events()
    ledger = read_jsonl(node_lab.state_dir / "ledger.jsonl")
    figures, ground = drill_figures(run_dir, events, ledger, served_after=node_lab.served)
    records = _records(run_dir)
    v = judge_drill(DrillFacts("engine-garbled", records, figures, ground, lab_events=events))
    assert v.state == "failed", v.reasons
    mine = [r for r in v.reasons if "(burn_rate_mitigated)" in r]
    assert len(mine) == 1 and mine[0].startswith("not mitigated: failure rate "), v.reasons
    # the window: from the mitigation time after the arming to the clear (ground truth)
    win = v.windows["mitigation"]
    assert win["start"] == pytest.approx(ground["fault_at"] + ENGINE_FAULT_MITIGATION_S)
    assert win["end"] == pytest.approx(ground["cleared_at"])
    # the class named, counted as the engine's ledger says: r0's garbled answers in the window
    garbled = _sabotaged(node_lab, "garbled")
    in_window = {
        r["request_id"]
        for r in records
        if win["start"] <= r["sent_at"] < win["end"]
        and r["request_id"] in garbled
        and r.get("error_class") == "garbled"
    }
    assert len(in_window) >= 10, len(in_window)
    assert f"garbled {len(in_window)}" in mine[0], mine[0]
    row = {r["criterion"]: r for r in v.rows}["burn_rate_mitigated"]
    assert row["key"] and row["value"] > 100  # about half the requests: burn rate ~500x


def _prompt_tokens(lab: Lab, token: str | None) -> float:
    """Sum of the replicas' ``vllm:prompt_tokens_total`` counters."""
    total = 0.0
    for rep in lab.meta["replicas"]:
        if rep.get("standby"):
            continue
        url = f"http://{lab.replica_host(rep['name'])}:{rep['port']}/metrics"
        for line in httpx.get(url, timeout=3).text.splitlines():
            if line.startswith("vllm:prompt_tokens_total"):
                total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.mark.lab
def test_rollback_command_and_deadman_undo_an_engine_fault(node_lab: Lab, tmp_path: Path) -> None:
    """Armed by hand (action only, no experiment): `chaos-infer rollback` disarms it through the
    ledger; a short ttl_s lets the lab's dead-man disarm it without anyone calling a rollback."""
    conf = {"infer_lab_dir": str(node_lab.state_dir), "infer_run_dir": str(tmp_path)}
    ef.set_engine_fault("empty", replica="all", configuration=conf)
    armed = {
        r["name"]: [f["mode"] for f in r["engine_faults"]] for r in node_lab.status()["replicas"]
    }
    assert armed == {"r0": ["empty"], "r1": ["empty"], "r2": []}
    out = _cli("rollback", "--state-dir", str(node_lab.state_dir))
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("disarmed empty") == 2, out.stdout
    assert all(r["engine_faults"] == [] for r in node_lab.status()["replicas"])
    # the dead-man: record ttl = ttl_s + margin; the engine's own ttl ends it first
    monkey_margin = ef.TTL_MARGIN_S
    try:
        ef.TTL_MARGIN_S = 0.5
        ef.set_engine_fault("slowdown", replica="r0", ttl_s=60, configuration=conf)
        record = json.loads((node_lab.state_dir / "faults.json").read_text())[0]
        assert record["ttl_s"] == 60.5 and record["host"] == node_lab.replica_host("r0")
        # make the record overdue, as if its time had passed: the watchdog undoes it
        with node_lab.edit_faults() as faults:
            faults[0]["injected_at"] = time.time() - 120
        deadline = time.monotonic() + 15
        while (
            not [  # the watchdog drops the record, undoes it, then writes this event
                e
                for e in node_lab.events()
                if e.get("phase") == "expired" and e.get("fault_id") == record["id"]
            ]
        ):
            assert time.monotonic() < deadline, "the dead-man never undid the engine fault"
            time.sleep(0.1)
    finally:
        ef.TTL_MARGIN_S = monkey_margin
    assert json.loads((node_lab.state_dir / "faults.json").read_text()) == []
    assert all(r["engine_faults"] == [] for r in node_lab.status()["replicas"])
    assert os.path.exists(node_lab.state_dir / "admin-token")
