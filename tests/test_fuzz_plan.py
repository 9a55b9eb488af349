"""Property-based tests: bad plans and bad experiments fail with ConfigError, never anything else.

``chaoslib_infer.plan.load_plan`` and the game day's experiment loader
(``chaoslib_infer.gameday._load_experiment``) read files users write by hand; any input must give
either a valid result or one :class:`ConfigError` naming the file (the CLI turns it into one line
and exit 2). Inputs: random text, random bytes, YAML-ish token soup (anchors, tags, dates, flow
collections, tabs) and plan/experiment-shaped documents whose fields have random types.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chaoslib_infer.errors import ConfigError
from chaoslib_infer.gameday import _load_experiment
from chaoslib_infer.plan import Plan, load_plan

SETTINGS = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(10**6), 10**6)
    | st.floats(allow_nan=True)
    | st.text(max_size=12)
    | st.sampled_from(["e.yaml", "../e.yaml", "/dev/null", "", "sim", "llama-cpp", "x/y", "\x00"])
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(scalars.filter(lambda k: k is not None), inner, max_size=4)
    ),
    max_leaves=15,
)
plan_key = st.sampled_from(["name", "lab", "drills", "description", "allow", "stop_conditions"])
lab_doc = st.dictionaries(
    st.sampled_from(["replicas", "engine", "memory_limit_mb", "nodes", "1bad", "", 3]) | scalars,
    values,
    max_size=4,
)
drill_doc = st.fixed_dictionaries(
    {},
    optional={
        "name": values | st.sampled_from(["oom-kill", "a", "a/b"]),
        "experiment": values | st.just("e.yaml"),
        "vars": values,
    },
)
plan_doc = st.fixed_dictionaries(
    {},
    optional={
        "name": values,
        "lab": lab_doc | values,
        "drills": st.lists(drill_doc | values, max_size=3) | values,
    },
) | st.dictionaries(plan_key, values, max_size=3)

yaml_tokens = st.sampled_from(
    [
        "drills:",
        "lab:",
        "name:",
        "experiment:",
        " ",
        "\n",
        "\t",
        "  ",
        "- ",
        ":",
        "[",
        "]",
        "{",
        "}",
        ",",
        "&a ",
        "*a",
        "!!str ",
        "!!int ",
        "!!binary ",
        "!!python/object:os.system ",
        "!!set ",
        "? ",
        "|",
        ">",
        "'",
        '"',
        "#",
        "%YAML 1.1\n",
        "---\n",
        "...\n",
        "2001-13-45",
        "2001-02-30 25:61:61",
        "0x1G",
        "1e999",
        ".inf",
        "~",
        "<<: *a",
        "e.yaml",
        "\\u0000",
        "\ufeff",
        "\x85",
        "\u2028",
    ]
)
yaml_soup = st.lists(yaml_tokens, max_size=30).map("".join)


@pytest.fixture
def folder() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp)
        (path / "e.yaml").write_text("title: t\n", encoding="utf-8")
        yield path


def _dump(doc: Any) -> str:
    try:
        return yaml.safe_dump(doc, allow_unicode=True)
    except yaml.YAMLError:
        return json.dumps(doc, default=str)


_REFUSED = object()


def _load_or_refused(load: Callable[[Path], Any], path: Path) -> Any:
    """``load(path)``, or :data:`_REFUSED` where it refused the file with a one-line
    ConfigError naming it."""
    try:
        return load(path)
    except ConfigError as exc:
        assert str(path) in str(exc)
        assert "\n" not in str(exc), str(exc)
        return _REFUSED


def _plan_outcome(path: Path) -> None:
    plan = _load_or_refused(load_plan, path)
    if plan is _REFUSED:
        return
    assert isinstance(plan, Plan) and plan.drills
    assert all(d.experiment.is_file() for d in plan.drills)


@SETTINGS
@given(plan_doc)
def test_plan_shaped_documents(folder: Path, doc: Any) -> None:
    path = folder / "plan.yaml"
    path.write_text(_dump(doc), encoding="utf-8")
    _plan_outcome(path)


@SETTINGS
@given(yaml_soup | st.text(max_size=200))
def test_plan_random_text(folder: Path, text: str) -> None:
    path = folder / "plan.yaml"
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    _plan_outcome(path)


@SETTINGS
@given(st.binary(max_size=200))
def test_plan_random_bytes(folder: Path, data: bytes) -> None:
    path = folder / "plan.yaml"
    path.write_bytes(data)
    _plan_outcome(path)


def test_plan_that_is_a_directory_or_missing(folder: Path) -> None:
    for path in (folder, folder / "missing.yaml"):
        with pytest.raises(ConfigError):
            load_plan(path)


# ---- experiments ---------------------------------------------------------------------------
# Only these module names appear in generated python providers: validating an experiment imports
# the provider's module, and a random name could import something with side effects.
SAFE_MODULES = [
    "chaoslib_infer.activities.lab",
    "chaoslib_infer.lab.testfault",
    "no.such.mod",
    "",
]
provider = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["python", "process", "http", "bogus"]) | scalars,
        "module": st.sampled_from(SAFE_MODULES) | st.integers(),
        "func": st.sampled_from(["clear_lab_faults", "echo", "nope"]) | scalars,
        "arguments": values,
        "path": st.just("/bin/true") | scalars,
        "url": st.just("http://127.0.0.1:9/") | scalars,
    },
)
activity = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["action", "probe", "bogus"]) | scalars,
        "name": values,
        "provider": provider | values,
        "tolerance": values,
        "pauses": values,
        "background": values,
    },
)
experiment_doc = st.fixed_dictionaries(
    {},
    optional={
        "version": values,
        "title": values,
        "description": values,
        "configuration": st.dictionaries(st.text(max_size=6), values, max_size=3) | values,
        "steady-state-hypothesis": st.fixed_dictionaries(
            {}, optional={"title": values, "probes": st.lists(activity, max_size=2) | values}
        )
        | values,
        "method": st.lists(activity, max_size=3) | values,
        "rollbacks": st.lists(activity, max_size=2) | values,
        "controls": values,
        "runtime": values,
    },
)


def _experiment_outcome(path: Path) -> None:
    experiment = _load_or_refused(_load_experiment, path)
    if experiment is _REFUSED:
        return
    assert isinstance(experiment, dict) and isinstance(experiment.get("method"), list)


@SETTINGS
@given(experiment_doc, st.sampled_from(["yaml", "json"]))
def test_experiment_shaped_documents(folder: Path, doc: Any, ext: str) -> None:
    path = folder / f"experiment.{ext}"
    text = _dump(doc) if ext == "yaml" else json.dumps(doc, default=str)
    path.write_text(text, encoding="utf-8")
    _experiment_outcome(path)


@SETTINGS
@given(
    yaml_soup | st.text(max_size=200) | st.binary(max_size=200).map(lambda b: b.decode("latin-1"))
)
def test_experiment_random_text(folder: Path, text: str) -> None:
    path = folder / "experiment.yaml"
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    _experiment_outcome(path)
