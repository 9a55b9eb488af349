"""Every load setting as configuration (issue 23 item 1): one table of names, types, defaults
and help (``load/options.py``), the same names on every shipped experiment (``load_<name>``), in
plans (``vars:``), on the command line (``--load-<name>``) and in the load generator's argv."""

from __future__ import annotations

import dataclasses
import inspect
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from chaoslib.configuration import load_configuration
from chaoslib.exceptions import InterruptExecution

from chaoslib_infer.controls import load as load_control
from chaoslib_infer.errors import ConfigError
from chaoslib_infer.load.__main__ import build_parser
from chaoslib_infer.load.client import LoadSpec, run_load_blocking
from chaoslib_infer.load.fakeserver import FakeServer
from chaoslib_infer.load.options import (
    LOAD_SETTINGS,
    choice,
    cli_flag,
    load_argv,
    load_vars,
    parse_setting,
)
from chaoslib_infer.load.records import read_records
from chaoslib_infer.plan import load_plan

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = sorted(
    p for p in (ROOT / "experiments").rglob("*.yaml") if "background-load" in p.read_text()
)
NAMES = [s.name for s in LOAD_SETTINGS]


def test_the_table_is_start_loads_signature() -> None:
    params = inspect.signature(load_control.start_load).parameters
    spec = {f.name: f.default for f in dataclasses.fields(LoadSpec)}
    for s in LOAD_SETTINGS:
        # a row start_load does not name reaches it as **more: the load spec's default is its
        default = params[s.name].default if s.name in params else spec[s.name]
        if s.name == "retry_on":  # None: the client's default, spelled out in the table
            assert default is None and tuple(s.default) == LoadSpec(url="http://x:1").retry_on
        else:
            assert parse_setting(s.name, default) == s.default, s.name
        assert s.help and s.metavar and s.var == f"load_{s.name}"


@pytest.mark.parametrize(
    ("name", "given", "want"),
    [
        ("retry_attempts", "3", 3),
        ("retry_attempts", 3.0, 3),
        ("rate_rps", "12.5", 12.5),
        ("ttft_timeout_s", "0", None),  # 0: no limit
        ("ttft_timeout_s", "off", None),
        ("idle_timeout_s", 2, 2.0),
        ("attempt_timeout_s", "none", None),
        ("max_concurrency", None, None),
        ("seed", "7", 7),
        ("profile", "12:8,15:28", [[12.0, 8.0], [15.0, 28.0]]),
        ("profile", [[12, 8]], [[12.0, 8.0]]),
        ("prompt_mix", {"short": 70, "long": 5}, "short:70,long:5"),
        ("prompt_mix", "", None),
        ("idempotency_header", "Idempotency-Key", "Idempotency-Key"),
        # the groups: a cut stream, a connect error
        ("retry_on", "http_5xx,cut_stream", ["http_5xx", "reset", "truncated", "timeout_idle"]),
        ("retry_on", ["connect_error", "connect"], ["connect", "timeout_connect"]),
    ],
)
def test_values_from_yaml_and_from_text(name: str, given: Any, want: Any) -> None:
    assert parse_setting(name, given) == want


@pytest.mark.parametrize(
    ("name", "given", "message"),
    [
        ("retry_attempts", "x", "load_retry_attempts: expected an integer >= 1, got 'x'"),
        ("retry_attempts", 0, "load_retry_attempts: expected an integer >= 1, got 0"),
        ("retry_attempts", True, "load_retry_attempts: expected an integer >= 1, got True"),
        ("rate_rps", "-1", "load_rate_rps: expected a number > 0, got '-1'"),
        ("ttft_timeout_s", "nan", "load_ttft_timeout_s: expected a number of seconds >= 0"),
        ("retry_on", "conect", "load_retry_on: unknown error class 'conect' (did you mean"),
        ("retry_on", [], "load_retry_on: expected a list of error classes"),
        ("idempotency_header", "a b", "load_idempotency_header: expected an HTTP header name"),
        ("idempotency_header", "X-Request-Id", "X-Request-Id is a header the load client sets"),
        ("profile", "12:x", "profile phase 1 is not two numbers"),
        ("prompt_mix", "huge:5", "load_prompt_mix: "),
        ("retry_atempts", 3, "load_retry_atempts: no such load setting (did you mean"),
    ],
)
def test_bad_values_are_one_line_naming_the_setting(name: str, given: Any, message: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_setting(name, given)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_the_generator_reads_back_what_the_table_writes() -> None:
    values = {
        **{s.name: s.default for s in LOAD_SETTINGS},
        "profile": [[12.0, 8.0], [15.0, 28.0]],
        "retry_attempts": 3,
        "retry_on": ["reset", "truncated"],
        "idle_timeout_s": None,
        "attempt_timeout_s": 2.5,
        "idempotency_header": "Idempotency-Key",
        "prompt_mix": "short:70,long:5",
        "seed": 11,
    }
    args = build_parser().parse_args(["--url", "http://x:1", "--out", "o", *load_argv(values)])
    assert (args.rate, args.profile, args.retry_attempts) == (8.0, "12.0:8.0,15.0:28.0", 3)
    assert (args.retry_on, args.idle_timeout_s, args.ttft_timeout_s) == ("reset,truncated", 0, 10)
    assert (args.attempt_timeout_s, args.idempotency_header) == (2.5, "Idempotency-Key")
    assert (args.prompt_mix, args.seed, args.max_tokens, args.timeout_s) == (
        "short:70,long:5",
        11,
        24,
        15.0,
    )
    assert args.max_concurrency is None  # none: left to the generator (sized from the plan)
    assert "--warmup-s" not in load_argv(values)  # the control's own


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shipped_experiment_takes_every_load_setting_as_configuration(path: Path) -> None:
    exp = yaml.safe_load(path.read_text())
    conf = exp["configuration"]
    (control,) = [c for c in exp["controls"] if c["name"] == "background-load"]
    args = control["provider"].get("arguments") or {}
    # every setting declared (so chaos run --var load_<name>=... reaches it), none written out
    # as an argument (which would win over the configuration)
    assert [n for n in NAMES if f"load_{n}" not in conf] == []
    assert set(args) & set(NAMES) == set()
    base = load_control.settings_in_force(exp)
    resolved = load_configuration(conf)  # env-typed keys (load_warmup_s) as chaos run reads them
    assert base == {s.name: parse_setting(s.name, resolved[s.var]) for s in LOAD_SETTINGS}
    got = load_control.settings_in_force(
        exp, {"load_retry_attempts": "4", "load_retry_on": "cut_stream", "load_warmup_s": 3}
    )
    assert got == {
        **base,
        "retry_attempts": 4,
        "retry_on": ["reset", "truncated", "timeout_idle"],
        "warmup_s": 3.0,
    }


def test_the_drills_keep_their_own_settings() -> None:
    def settings(name: str) -> dict[str, Any]:
        exp = yaml.safe_load((ROOT / "experiments" / f"{name}.yaml").read_text())
        got = load_control.settings_in_force(exp)
        assert got is not None
        return got

    jitter = settings("network-jitter")  # the client that gives up after 1 s and retries
    assert (jitter["retry_attempts"], jitter["attempt_timeout_s"]) == (3, 1.0)
    spike = settings("traffic-spike")
    assert (spike["profile"], spike["seed"]) == ([[12.0, 8.0], [15.0, 28.0], [12.0, 8.0]], 11)
    node = settings("node-loss")
    assert (node["rate_rps"], node["retry_attempts"], node["warmup_s"]) == (8.0, 1, 8.0)


def test_the_control_takes_the_configuration_and_its_own_arguments_win() -> None:
    conf = {"load_retry_attempts": "3", "load_rate_rps": 5, "infer_run_dir": "x"}
    assert load_control.control_arguments({"rate_rps": 9}, conf) == {
        "retry_attempts": 3,
        "rate_rps": 9,
    }
    with pytest.raises(ValueError, match="load_retry_attempts: expected an integer"):
        load_control.control_arguments({}, {"load_retry_attempts": "many"})


def test_a_bad_configured_setting_interrupts_the_drill_with_one_line(tmp_path: Path) -> None:
    cfg = {"infer_run_dir": str(tmp_path), "load_idle_timeout_s": "-2"}
    with pytest.raises(InterruptExecution) as info:
        load_control.before_experiment_control({}, cfg, max_duration_s=10)
    line = "background-load: load_idle_timeout_s: expected a number of seconds >= 0, got '-2'"
    assert str(info.value) == line
    assert (tmp_path / "load_error.txt").read_text().strip() == line


def _plan(tmp_path: Path, doc: dict[str, Any]) -> Path:
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _drill(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "experiment": str(ROOT / "experiments" / f"{name}.yaml"), **extra}


def test_plan_vars_for_every_drill_under_each_drills_own(tmp_path: Path) -> None:
    plan = load_plan(
        _plan(
            tmp_path,
            {
                "vars": {"load_retry_attempts": 3, "load_retry_on": ["cut_stream"]},
                "drills": [
                    _drill("node-loss"),
                    _drill("network-jitter", vars={"load_retry_attempts": 2}),
                ],
            },
        )
    )
    node, jitter = plan.drills
    assert node.vars == {"load_retry_attempts": 3, "load_retry_on": ["cut_stream"]}
    assert jitter.vars == {"load_retry_attempts": 2, "load_retry_on": ["cut_stream"]}


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (
            {"vars": {"load_retry_attempts": "x"}, "drills": [_drill("oom-kill")]},
            "plan.yaml: vars.load_retry_attempts: expected an integer >= 1, got 'x'",
        ),
        (
            {"drills": [_drill("oom-kill", vars={"load_retry_atempts": 3})]},
            "plan.yaml: drills[0].vars.load_retry_atempts: no such load setting (did you mean "
            "'load_retry_attempts'?)",
        ),
        ({"vars": [1], "drills": [_drill("oom-kill")]}, "plan.yaml: vars: expected a mapping"),
    ],
)
def test_bad_plan_vars_are_refused_naming_the_field(
    tmp_path: Path, doc: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_plan(_plan(tmp_path, doc))
    assert message in str(info.value)


def test_an_experiments_own_load_key_is_no_typo(tmp_path: Path) -> None:
    tool = {"name": "t", "experiment": str(ROOT / "experiments" / "tools" / "engine-fault.yaml")}
    tool["vars"] = {"load_max_duration_s": 60}  # declared by the tool, not a load setting
    assert load_plan(_plan(tmp_path, {"drills": [tool]})).drills[0].vars == tool["vars"]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "chaoslib_infer.cli", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )


def test_the_command_line_sets_every_drill_and_the_dry_run_shows_it(tmp_path: Path) -> None:
    plan = _plan(
        tmp_path,
        {
            "vars": {"load_retry_attempts": 2},
            "drills": [_drill("node-loss"), _drill("traffic-spike")],
        },
    )
    out = _cli(
        "gameday", str(plan), "--dry-run", "--out", str(tmp_path / "o"),
        "--load-retry-attempts", "3", "--load-idempotency-header", "Idempotency-Key",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    lines = [line.strip() for line in out.stdout.splitlines() if line.strip().startswith("load:")]
    assert len(lines) == 2
    for line in lines:  # the command line wins over the plan's vars
        assert "retry_attempts=3 " in line and "idempotency_header=Idempotency-Key " in line
    assert "profile=none " in lines[0] and "profile=12:8,15:28,12:8 " in lines[1]
    assert "seed=11 " in lines[1] and "warmup_s=8" in lines[1]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--load-retry-attempts", "x"], "--load-retry-attempts: expected an integer >= 1"),
        (["--load-retry-on", "5xx"], "--load-retry-on: unknown error class '5xx'"),
    ],
)
def test_bad_command_line_values_exit_2_with_one_line(
    tmp_path: Path, args: list[str], message: str
) -> None:
    out = _cli("drill", "run", "oom-kill", "--dry-run", "--out", str(tmp_path / "o"), *args)
    assert out.returncode == 2
    assert out.stderr.startswith(f"chaos-infer: error: {message}")
    assert out.stderr.count("\n") == 1 and not (tmp_path / "o").exists()


def test_every_setting_is_an_option_of_gameday_and_drill_run() -> None:
    for command in (["gameday"], ["drill", "run"]):
        text = _cli(*command, "--help").stdout
        assert all(cli_flag(s) in text for s in LOAD_SETTINGS), command


@pytest.mark.parametrize("transport", ["raw", "aiohttp"])
def test_the_idempotency_key_is_the_request_id_on_every_attempt(
    tmp_path: Path, transport: str
) -> None:
    with FakeServer() as server:  # the first attempt of each request answers 503, the retry 200
        spec = LoadSpec(
            url=server.url + "/mode=http,status=503,fail=1",
            rate_rps=20,
            duration_s=0.3,
            retry_attempts=2,
            retry_backoff_s=0.0,
            idempotency_header="Idempotency-Key",
            transport=transport,  # type: ignore[arg-type]
        )
        run_load_blocking(spec, tmp_path / "rec.jsonl")
        headers = list(server.request_headers)
    recs = read_records(tmp_path / "rec.jsonl")
    assert recs and {r["attempt"] for r in recs} == {1, 2}
    sent = [(h["x-request-id"], h.get("idempotency-key")) for h in headers]
    assert len(sent) == len(recs) and all(rid == key for rid, key in sent)
    # without the setting, no such header
    assert load_vars({"load_idempotency_header": None}) == {"idempotency_header": None}


def test_the_well_run_plan_is_the_default_game_day_with_plan_options_only() -> None:
    well = load_plan(ROOT / "examples" / "well-run" / "gameday.yaml")
    default = load_plan(ROOT / "drills" / "gameday.yaml")
    # the same shipped experiments, in the same order, unmodified (the files themselves)
    assert [(d.name, d.experiment) for d in well.drills] == [
        (d.name, d.experiment) for d in default.drills
    ]
    # the same lab but for the engine's warm-up (the oom-kill fix)
    lab = dict(well.lab.options)
    assert lab.pop("engine_args") == {"max_num_seqs": 4, "warmup_requests": 0}
    assert {k: v for k, v in default.lab.options.items() if k != "engine_args"} == lab
    assert (well.lab.replicas, well.lab.engine) == (default.lab.replicas, default.lab.engine)
    # every other fix is a load setting, and every drill retries a cut stream
    for drill in well.drills:
        assert set(drill.vars) <= {s.var for s in LOAD_SETTINGS}, drill.name
        assert {"reset", "truncated", "timeout_idle"} <= set(
            parse_setting("retry_on", drill.vars["load_retry_on"])
        )
    jitter = next(d for d in well.drills if d.name == "network-jitter")
    assert jitter.vars["load_attempt_timeout_s"] > 1.0  # above the slowest generation


def test_a_choice_setting_takes_one_of_its_values() -> None:
    parse = choice("raw", "openai-sdk")  # how a row such as client: raw|openai-sdk reads
    assert parse(" openai-sdk") == "openai-sdk"
    with pytest.raises(ValueError, match="expected one of raw, openai-sdk, got 'sdk'"):
        parse("sdk")


def test_the_sdk_clients_settings_flow_through_the_table(tmp_path: Path) -> None:
    values = {"client": "openai-sdk", "sdk_max_retries": 0, "sdk_timeout_s": 20.0}
    args = build_parser().parse_args(["--url", "http://x:1", "--out", "o", *load_argv(values)])
    assert (args.client, args.sdk_max_retries, args.sdk_timeout_s) == ("openai-sdk", 0, 20.0)
    exp = yaml.safe_load((ROOT / "experiments" / "oom-kill.yaml").read_text())
    got = load_control.settings_in_force(exp, {"load_client": "openai-sdk"})
    assert got is not None and got["client"] == "openai-sdk"
    # the load spec's own cross-check, before anything starts: the SDK owns the retries
    conf = {"infer_run_dir": str(tmp_path), "load_client": "openai-sdk", "load_retry_attempts": 3}
    with pytest.raises(InterruptExecution, match="^background-load: .*retry_attempts") as info:
        load_control.before_experiment_control({}, conf, max_duration_s=10)
    assert "\n" not in str(info.value) and not (tmp_path / "load.pid").exists()
