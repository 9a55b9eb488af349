"""Defects a new-user trial of ``chaos-infer`` found, one section per fix.

1. Click's usage errors (a bad option value, a missing argument, an unknown option or command)
   are one line, ``chaos-infer: error: WHAT (see CMD --help)``, exit 2, on every command;
   ``--help`` is unchanged.
2. A malformed ``--criterion`` (``:warmup_ratio=3``, ``:=3``, ``a:b=``) is one line, exit 2.
3. ``drill run NAME`` ends with ``drill NAME VERDICT``, a game day with ``game day VERDICT``.
8. A game day interrupted after a failed drill is ``ABORTED``, exit 130 (README, "Exit code").
4. ``junit.xml`` writes the steady-state hypothesis in words, never a dict repr.
5. Each ``--load-*`` help names the default the shipped drills really use (``auto`` warm-up).
7. ``--dry-run`` prints the fault parameters with ``${...}`` resolved (an undefined key named).
6. An ``--out`` folder that holds files is refused with one line before anything runs (a killed
   run's folder with faults to undo excepted); ``--dry-run`` says so.

The game-day tests stub the drill run (``run_drill``) and the target's preflight: no lab, no load.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner
from labutil import cli

from chaoslib_infer.cli import main

ROOT = Path(__file__).resolve().parent.parent


def _one_line_exit_2(stderr: str, code: int, *fragments: str) -> str:
    """The single line on stderr (exit 2, no traceback, no ``Usage:`` block)."""
    assert code == 2, stderr
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, stderr
    line = lines[0]
    assert line.startswith("chaos-infer: error: "), line
    assert "Usage:" not in stderr and "Try '" not in stderr and "Traceback" not in stderr
    for fragment in fragments:
        assert fragment in line, line
    return line


def _invoke(*args: str) -> click.testing.Result:
    return CliRunner().invoke(main, list(args), prog_name="chaos-infer")


# ---- 1. usage errors: one line, exit 2 ---------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (
            ("gameday", "--verdict-policy", "nonsense"),
            (
                "invalid value for '--verdict-policy': 'nonsense' is not one of 'default', "
                "'strict' (see ",
                " gameday --help)",
            ),
        ),
        (
            ("gameday", "--replicas", "0"),
            ("invalid value for '--replicas'", "0 is not in the range", "gameday --help)"),
        ),
        (
            ("gameday", "--gateway-config", "/nope.conf"),
            ("invalid value for '--gateway-config'", "/nope.conf", "does not exist"),
        ),
        (
            ("drill", "run"),
            ("missing argument 'NAME' (see ", " drill run --help)"),
        ),
    ],
)
def test_the_trials_usage_errors_are_one_line_as_a_user_sees_them(
    tmp_path: Path, args: tuple[str, ...], fragments: tuple[str, ...]
) -> None:
    # as `python -m chaoslib_infer.cli` the command's path starts so; `chaos-infer` as installed
    proc = cli(*args, timeout=60, cwd=tmp_path)
    line = _one_line_exit_2(proc.stderr, proc.returncode, *fragments)
    assert ". (see" not in line, line
    assert proc.stdout == ""
    assert list(tmp_path.iterdir()) == []  # refused before anything ran


# every command and group of the CLI (arguments, then the command's path), with an option none
# of them has
COMMANDS = [
    (("gameday",), "gameday"), (("drill", "run", "oom-kill"), "drill run"),
    (("drill", "list"), "drill list"), (("drill",), "drill"), (("lab", "up"), "lab up"),
    (("lab", "status"), "lab status"), (("lab", "down"), "lab down"), (("rollback",), "rollback"),
    (("report", "x"), "report"), (("capacity",), "capacity"), (("alerts",), "alerts"),
    (("schedule",), "schedule"), (("certify",), "certify"),
    (("load", "three-phase"), "load three-phase"), (("load", "soak"), "load soak"),
    (("load", "ceiling"), "load ceiling"), ((), ""),
]  # fmt: skip


@pytest.mark.parametrize(("args", "path"), COMMANDS, ids=lambda c: str(c))
def test_every_command_refuses_an_unknown_option_in_one_line(
    args: tuple[str, ...], path: str
) -> None:
    res = _invoke(*args, "--no-such-option")
    where = f"(see {' '.join(('chaos-infer', path)).strip()} --help)"
    _one_line_exit_2(res.stderr, res.exit_code, "no such option", "--no-such-option", where)


def test_unknown_commands_and_bad_values_elsewhere_are_one_line() -> None:
    res = _invoke("gamedya")
    _one_line_exit_2(res.stderr, res.exit_code, "no such command 'gamedya'", "chaos-infer --help")
    res = _invoke("drill", "runn")
    _one_line_exit_2(
        res.stderr, res.exit_code, "no such command 'runn'", "chaos-infer drill --help"
    )
    res = _invoke("capacity", "--peak-qps", "fast")
    _one_line_exit_2(res.stderr, res.exit_code, "'--peak-qps'", "'fast' is not a valid float")
    res = _invoke("load", "soak", "--rate")
    _one_line_exit_2(res.stderr, res.exit_code, "option '--rate' requires an argument")


def test_a_command_run_on_its_own_refuses_in_one_line_too() -> None:
    from chaoslib_infer.cli.report import report

    res = CliRunner().invoke(report, ["x", "--junit-inconclusive", "green"], prog_name="report")
    _one_line_exit_2(res.stderr, res.exit_code, "'green' is not one of 'failure', 'skipped'")


def test_help_is_clicks_unchanged() -> None:
    for args in (("--help",), ("gameday", "--help"), ("drill", "run", "--help"), ("lab", "-h")):
        res = _invoke(*args)
        assert res.exit_code == 0, res.output
        assert res.stdout.startswith("Usage: chaos-infer "), res.stdout
        assert res.stderr == ""
    res = _invoke("drill")  # a group without a command: its help, as Click gives it
    assert "Usage: chaos-infer drill [OPTIONS] COMMAND [ARGS]..." in res.output
    assert "chaos-infer: error" not in res.output


def test_a_usage_error_from_a_subprocess_has_no_usage_block(tmp_path: Path) -> None:
    proc = cli("lab", "up", "--replicas", "many", timeout=60, cwd=tmp_path)
    _one_line_exit_2(
        proc.stderr, proc.returncode, "'many' is not a valid integer", "lab up --help)"
    )


# ---- 2. malformed --criterion shapes: one line, exit 2 ----------------------------------------
@pytest.mark.parametrize(
    ("item", "fragment"),
    [
        (":warmup_ratio=3", "(an empty drill name before ':')"),
        (" :warmup_ratio=3", "(an empty drill name before ':')"),
        ("oom-kill:", "expected [DRILL:]NAME=VALUE"),
        (":=3", "(an empty criterion name)"),
        ("oom-kill:=3", "(an empty criterion name)"),
        ("=3", "expected [DRILL:]NAME=VALUE"),
        ("oom-kill:warmup_ratio=", "empty value"),
        ("a:b=", "empty value"),
        ("oom-kill:warmup_ratio:x=3", "(one ':' at most)"),
    ],
)
def test_a_malformed_criterion_is_refused_in_one_line(
    tmp_path: Path, item: str, fragment: str
) -> None:
    for command in (("gameday",), ("drill", "run", "oom-kill")):
        res = _invoke(*command, "--dry-run", "--out", str(tmp_path / "o"), "--criterion", item)
        line = _one_line_exit_2(res.stderr, res.exit_code, "--criterion", fragment)
        assert repr(item) in line or "empty value" in line, line
        assert res.stdout == ""


def test_well_formed_criteria_still_parse() -> None:
    from chaoslib_infer.verdict import parse_override

    assert parse_override("oom-kill:warmup_ratio=3") == ("oom-kill", "warmup_ratio", 3.0)
    assert parse_override(" oom-kill : restart_s = off") == ("oom-kill", "restart_s", None)
    assert parse_override("restart_s=20") == (None, "restart_s", 20.0)


# ---- 3 and 8: the last line names what ran; an interrupted game day is ABORTED, exit 130 ------
def _stub_drills(monkeypatch: pytest.MonkeyPatch, entries: list[Any]) -> None:
    """``run_drill`` replaced: each call returns the next entry (a callable: called, e.g. to
    raise); ``preflight_url`` answers. No lab, no load."""
    from chaoslib_infer import gameday

    todo = list(entries)

    def fake_run_drill(spec: Any, drill_dir: Path, *_a: Any, **_kw: Any) -> dict[str, Any]:
        drill_dir.mkdir(parents=True, exist_ok=True)
        entry = todo.pop(0)
        if callable(entry):
            entry = entry()
        return {"name": spec.name, "experiment": str(spec.experiment), "figures": {}, **entry}

    monkeypatch.setattr(gameday, "run_drill", fake_run_drill)
    monkeypatch.setattr(gameday, "preflight_url", lambda url: None)


def _tiny_plan(tmp_path: Path, n: int) -> Path:
    exp = ROOT / "experiments" / "oom-kill.yaml"
    plan = tmp_path / "plan.yaml"
    drills = "".join(f"  - {{name: d{i}, experiment: {exp}}}\n" for i in range(n))
    plan.write_text(f"name: tiny\ndrills:\n{drills}", encoding="utf-8")
    return plan


PASSED: dict[str, Any] = {"status": "passed", "reasons": []}
FAILED: dict[str, Any] = {"status": "failed", "reasons": ["restart time: 40 s > 30 s"]}
ABORTED: dict[str, Any] = {"status": "aborted", "reasons": ["stopped: the run was interrupted"]}


@pytest.mark.parametrize(("entry", "word", "code"), [(PASSED, "PASSED", 0), (FAILED, "FAILED", 1)])
def test_a_drill_run_ends_with_the_drills_verdict_not_the_game_days(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, entry: dict[str, Any], word: str, code: int
) -> None:
    _stub_drills(monkeypatch, [entry])
    out = tmp_path / "d"
    res = _invoke("drill", "run", "oom-kill", "--target", "http://127.0.0.1:9", "--out", str(out))
    assert res.exit_code == code, res.output
    last = res.stdout.strip().splitlines()[-1]
    assert last == f"drill oom-kill {word}: {out / 'summary.json'}, {out / 'index.html'}"
    assert "game day" not in res.stdout


def test_a_game_day_still_says_game_day(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _stub_drills(monkeypatch, [PASSED, FAILED])
    out = tmp_path / "g"
    res = _invoke(
        "gameday", str(_tiny_plan(tmp_path, 2)), "--target", "http://127.0.0.1:9", "--out", str(out)
    )
    assert res.exit_code == 1, res.output
    lines = res.stdout.strip().splitlines()
    assert lines[-1] == f"game day FAILED: {out / 'summary.json'}, {out / 'index.html'}"
    # the closing table: each drill's verdict at a glance, before the last line
    assert lines[-4].split() == ["drill", "verdict", "first", "reason"], lines[-6:]
    assert [ln.split()[1] for ln in lines[-3:-1]] == ["PASSED", "FAILED"], lines[-6:]


def test_lab_status_and_down_without_a_lab_say_where_a_runs_own_lab_is(tmp_path: Path) -> None:
    """Found by a new-user trial: after ``drill run --out D`` the lab commands looked in the
    default folder and did not say that the run's lab is ``D/lab``."""
    res = _invoke("lab", "status", "--state-dir", str(tmp_path / "none"))
    _one_line_exit_2(res.stderr, res.exit_code, "no lab in", "--state-dir OUT/lab")
    res = _invoke("lab", "down", "--state-dir", str(tmp_path / "none"))
    assert res.exit_code == 0 and "nothing to take down" in res.stdout
    assert "--state-dir OUT/lab" in res.stdout


def _sigterm() -> dict[str, Any]:
    os.kill(os.getpid(), signal.SIGTERM)  # run_gameday's handler raises KeyboardInterrupt
    raise AssertionError("SIGTERM did not interrupt the drill")


@pytest.mark.parametrize(
    "second",
    [ABORTED, _sigterm],
    ids=["drill-aborted-by-the-signal", "signal-outside-chaoslib"],
)
def test_a_game_day_interrupted_after_a_failed_drill_is_aborted_exit_130(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, second: Any
) -> None:
    _stub_drills(monkeypatch, [FAILED, second, PASSED])
    out = tmp_path / "g"
    res = _invoke(
        "gameday", str(_tiny_plan(tmp_path, 3)), "--target", "http://127.0.0.1:9", "--out", str(out)
    )
    assert res.exit_code == 130, res.output
    assert res.stdout.strip().splitlines()[-1].startswith("game day ABORTED: ")
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert summary["complete"] is False and summary["verdict"] == "aborted"
    assert [d["status"] for d in summary["drills"]][:1] == ["failed"]  # kept, not hidden
    assert len(summary["drills"]) <= 2  # no drill ran after the interruption
    assert 'class="verdict v-ABORTED"' in (out / "index.html").read_text(encoding="utf-8")


def test_the_final_exit_code_and_verdict_word() -> None:
    from chaoslib_infer.gameday import final_exit_code, gameday_verdict

    cases = [
        # how the loop ended, the drills' states -> exit code, verdict word
        (130, ["failed", "aborted"], 130, "ABORTED"),
        (130, ["passed", "failed"], 130, "ABORTED"),  # interrupted between drills
        (130, ["passed", "aborted"], 130, "ABORTED"),
        (0, ["passed", "failed"], 1, "FAILED"),
        (0, ["passed", "inconclusive"], 3, "INCONCLUSIVE"),
        (0, ["passed"], 0, "PASSED"),
        (2, ["failed"], 1, "FAILED"),  # a failure outranks a later drill the tool could not run
        (2, ["passed"], 2, "ERROR"),
    ]
    for so_far, states, code, word in cases:
        got = final_exit_code(so_far, states)
        assert (got, gameday_verdict(got, False)) == (code, word), (so_far, states)
    assert gameday_verdict(final_exit_code(1, ["aborted"]), True) == "STOPPED"


# ---- 4. junit.xml writes the steady-state hypothesis in words, not a dict repr ----------------
def _junit_text(entry: dict[str, Any]) -> str:
    import xml.etree.ElementTree as ET

    from chaoslib_infer.evidence.bundle import junit_xml

    root = ET.fromstring(junit_xml({"plan": "p", "drills": [entry]}))
    case = next(c for c in root.iter("testcase") if c.get("name") == entry["name"])
    out = case.find("system-out")
    assert out is not None
    return out.text or ""


def test_junit_writes_the_hypothesis_title_probes_and_tolerances(tmp_path: Path) -> None:
    import yaml

    from chaoslib_infer.gameday import drill_evidence

    experiment = yaml.safe_load((ROOT / "experiments" / "oom-kill.yaml").read_text())
    journal = {
        "experiment": experiment,
        "steady_states": {"before": {"steady_state_met": True}, "after": None},
    }
    drill_dir = tmp_path / "oom-kill"
    drill_dir.mkdir()
    entry = drill_evidence(
        "oom-kill", "experiments/oom-kill.yaml", "OOM kill", drill_dir, journal, None,
        {"kind": "url", "url": "http://127.0.0.1:1", "engine": "unknown", "replicas": 0},
        1000.0, 1010.0, kind="oom-kill",
    )  # fmt: skip
    assert entry["hypothesis"] == {"before": True, "after": None}  # its shape is unchanged
    title = experiment["steady-state-hypothesis"]["title"]
    assert entry["steady_state"]["title"] == title
    text = _junit_text(entry)
    assert "{'" not in text and "'title'" not in text and "None" not in text, text
    lines = text.splitlines()
    assert (
        f'steady-state hypothesis "{title}": before the fault held, after it not evaluated' in lines
    )
    probes = next(ln for ln in lines if ln.startswith("probes: "))
    assert "availability-meets-slo ($.passed == true)" in probes
    assert "p99-e2e-latency-meets-slo ($.passed == true)" in probes
    assert "availability=unmeasured p99_e2e_s=unmeasured evidence=oom-kill/evidence.md" in lines


def test_junit_of_an_older_summary_and_the_tolerance_shapes() -> None:
    from chaoslib_infer.evidence.hypothesis import tolerance_text

    old = {"name": "a", "status": "failed", "hypothesis": {"before": True, "after": False},
           "figures": {"availability": 0.98}}  # fmt: skip
    text = _junit_text(old)
    assert "steady-state hypothesis: before the fault held, after it did not hold" in text
    assert "{'" not in text and "probes:" not in text
    assert "availability=0.98 p99_e2e_s=unmeasured" in text
    assert tolerance_text(True) == "== true"
    assert tolerance_text(200) == "== 200"
    assert tolerance_text([200, 201]) == "one of [200, 201]"
    assert tolerance_text({"type": "range", "range": [0, 1], "target": "body"}) == "body in [0, 1]"
    assert tolerance_text({"type": "regex", "pattern": "^ok"}) == "matches ^ok"
    assert tolerance_text({"type": "jsonpath", "path": "$.n", "expect": [1]}) == "$.n == [1]"
    assert tolerance_text({"type": "probe", "name": "check"}) == "probe check"


# ---- 5. --load-* help states the default a user of the shipped drills really gets -------------
def _shipped_values(var: str) -> dict[str, str]:
    """``{experiment: value as text}`` of configuration key ``var`` in every shipped experiment
    that runs the background load (an env-typed key: its default)."""
    import yaml

    from chaoslib_infer.load.options import parse_var, setting_text

    out = {}
    for path in sorted((ROOT / "experiments").rglob("*.yaml")):
        exp = yaml.safe_load(path.read_text(encoding="utf-8"))
        if not any(c.get("name") == "background-load" for c in exp.get("controls") or []):
            continue
        value = exp["configuration"][var]
        if isinstance(value, dict) and value.get("type") == "env":
            value = value.get("default")
        name, parsed = parse_var(var, value)
        out[str(path.relative_to(ROOT))] = setting_text(name, parsed)
    return out


def test_each_load_options_help_names_the_default_the_shipped_drills_use() -> None:
    from chaoslib_infer.cli.gameday import gameday
    from chaoslib_infer.load.options import LOAD_SETTINGS, cli_flag, setting_text

    helps = {p.opts[0]: p.help or "" for p in gameday.params if isinstance(p, click.Option)}
    for s in LOAD_SETTINGS:
        text = " ".join(helps[cli_flag(s)].split())
        shipped = _shipped_values(s.var)
        assert len(shipped) >= 14, shipped  # the seven drills, lab and Kubernetes
        table = "none" if s.default is None else setting_text(s.name, s.default)
        if table in shipped.values():  # some shipped drill runs with the table's default
            assert f"(default {table}; the drill's experiment may set its own)" in text, text
        else:
            assert f"(default {table};" not in text, text
            for value in set(shipped.values()):
                assert value in text, (s.name, value, text)
    warmup = " ".join(helps["--load-warmup-s"].split())
    assert (
        "(default auto in the shipped drills (traffic-spike's lab experiment: 8); 6 in an "
        "experiment that sets none)" in warmup
    ), warmup
    assert _shipped_values("load_warmup_s")["experiments/traffic-spike.yaml"] == "8"


# ---- 7. --dry-run prints the fault parameters resolved, as chaoslib will pass them ------------
def _dry_run_lines(*args: str) -> list[str]:
    res = _invoke(*args, "--dry-run")
    assert res.exit_code == 0, res.output
    return res.stdout.splitlines()


def test_the_dry_run_resolves_every_placeholder_of_the_shipped_drills(tmp_path: Path) -> None:
    lines = _dry_run_lines("gameday", "--out", str(tmp_path / "o"))
    actions = [ln for ln in lines if ln.startswith("    action: ")]
    assert len(actions) >= 7, lines
    assert not [ln for ln in lines if "${" in ln], lines
    freeze = next(ln for ln in actions if "freeze-one-replica" in ln)
    assert "'mode': 'freeze', 'hold_s': 15" in freeze, freeze  # upstream-timeout's own values
    assert not (tmp_path / "o").exists()


def test_the_dry_run_resolves_with_the_plans_vars_and_names_an_undefined_key(
    tmp_path: Path,
) -> None:
    import yaml

    exp = yaml.safe_load((ROOT / "experiments" / "upstream-timeout.yaml").read_text())
    exp["method"][0]["provider"]["arguments"]["replica"] = "${nope}"
    exp["method"][0]["pauses"] = {"after": "${hold_s}"}
    path = tmp_path / "ut.yaml"
    path.write_text(yaml.safe_dump(exp, sort_keys=False), encoding="utf-8")
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        f"name: p\ndrills:\n  - name: upstream-timeout\n    experiment: {path}\n"
        "    vars: {hold_s: 7, freeze_mode: sigstop}\n",
        encoding="utf-8",
    )
    lines = _dry_run_lines("gameday", str(plan), "--out", str(tmp_path / "o"))
    freeze = next(ln for ln in lines if "freeze-one-replica" in ln)
    assert freeze == (
        "    action: freeze-one-replica {'replica': '${nope}', 'mode': 'sigstop', 'hold_s': 7, "
        "'ttl_s': 120} (then wait 7 s) [unresolved: ${nope} (undefined)]"
    ), freeze


# ---- 6. an --out folder that holds files is refused before anything runs ----------------------
DEAD_URL = "http://127.0.0.1:1"


@pytest.mark.parametrize("command", [("gameday",), ("drill", "run", "oom-kill")])
def test_a_non_empty_out_folder_is_refused_in_one_line_and_left_alone(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    out = tmp_path / "old"
    (out / "oom-kill").mkdir(parents=True)
    (out / "notes.txt").write_text("mine\n")
    (out / "oom-kill" / "records.jsonl").write_text("{}\n")
    out.chmod(0o755)
    before = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
    # an unreachable target: the folder is refused first, before the preflight or a lab
    res = _invoke(*command, "--target", DEAD_URL, "--out", str(out))
    _one_line_exit_2(
        res.stderr, res.exit_code,
        f"--out {out}: folder is not empty (2 files); choose a new folder",
    )  # fmt: skip
    assert res.stdout == ""
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == before
    assert out.stat().st_mode & 0o777 == 0o755  # not made private under its owner's feet


def test_an_empty_out_folder_is_used_and_a_dry_run_only_warns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "full" / "x").mkdir(parents=True)
    (tmp_path / "full" / "x" / "one").write_text("1")
    lines = _dry_run_lines("gameday", "--out", str(tmp_path / "full"))
    assert lines[0] == (
        f"--out {tmp_path / 'full'}: folder is not empty (1 file); choose a new folder "
        "(a real run refuses it)"
    )
    assert lines[-1] == "dry run: nothing was started or changed"
    _stub_drills(monkeypatch, [PASSED])
    empty = tmp_path / "empty"
    (empty / "sub").mkdir(parents=True)  # folders only: no file to mistake for evidence
    res = _invoke("drill", "run", "oom-kill", "--target", "http://127.0.0.1:9", "--out", str(empty))
    assert res.exit_code == 0, res.output
    assert (empty / "summary.json").is_file()


def test_a_killed_runs_folder_is_taken_up_again_to_undo_what_it_left(tmp_path: Path) -> None:
    from chaoslib_infer.cli.out_folder import killed_run_leftovers, out_folder_refusal

    done = tmp_path / "done"
    (done / "lab").mkdir(parents=True)
    (done / "summary.json").write_text("{}")
    assert not killed_run_leftovers(done)
    assert out_folder_refusal(done) == (
        f"--out {done}: folder is not empty (1 file); choose a new folder"
    )
    k8s = tmp_path / "k8s"
    (k8s / "quota-cut" / "k8s-state").mkdir(parents=True)
    (k8s / "quota-cut" / "k8s-state" / "quota-cut.json").write_text("{}")
    assert killed_run_leftovers(k8s) and out_folder_refusal(k8s) is None
    lab = tmp_path / "lab-run"
    (lab / "lab").mkdir(parents=True)
    (lab / "lab" / "lab.json").write_text("{}")
    (lab / "lab" / "faults.json").write_text('[{"id": "f1", "kind": "test-marker"}]')
    assert killed_run_leftovers(lab) and out_folder_refusal(lab) is None
    assert out_folder_refusal(tmp_path / "absent") is None
