"""Chaos Toolkit control that runs the background load around a whole experiment.

Declare it in an experiment::

    controls:
      - name: background-load
        provider:
          type: python
          module: chaoslib_infer.controls.load
          arguments: {rate_rps: 8, warmup_s: 6, max_duration_s: 240}

Before the experiment (before the first steady-state hypothesis) it starts the open-loop streaming
load generator (``python -m chaoslib_infer.load``) as a separate process writing per-attempt records
to ``<infer_run_dir>/records.jsonl`` and waits ``warmup_s`` seconds. When no request succeeded in
the warm-up (:func:`warmup_finding`):

* the tool could not run (the load process died, it sent nothing, or every attempt failed to
  connect: the target is unreachable, as configured): the experiment is interrupted (the drill's
  verdict is ``error``, exit 2);
* the service held or failed what it was sent (requests hung in flight, timed out, answered 5xx,
  wrong or empty): that is the service's failure, not the tool's. The finding goes to
  ``<infer_run_dir>/warmup.json`` and the drill runs on; its verdict is ``failed``, "the service
  did not meet its SLOs before the fault (nothing answered in N s: ...)", exit 1.

After the experiment (after the rollbacks) it stops the load. The load is bounded: it stops by
itself after ``max_duration_s`` even if nobody stops it. Its in-flight cap (``max_concurrency``)
is sized from the plan by default (the rate x the request deadline, at least 1000:
``LoadSpec.cap``); a request due while it is full is recorded ``not_sent``.

Retries (``retry_attempts``, ``retry_backoff_s``, ``attempt_timeout_s``) are the load client's own
policy (``chaoslib_infer.load.client``); every attempt is a record with ``final`` marking the one
that ended its logical request. A rate ``profile`` (``[[duration_s, rate_rps], ...]``) replaces
``rate_rps``; the warm-up runs inside its first phase, so start the profile with a baseline phase
longer than ``warmup_s``. ``max_duration_s`` still bounds the load (the profile is cut there).

Prompt lengths: ``prompt_mix`` (``"short:70,mid:25,long:5"``, ``"64:80,2048:20"`` or a mapping
``{short: 70, long: 5}``; :mod:`chaoslib_infer.load.mix`) replaces the fixed 16-word prompt.
Client timeouts: ``ttft_timeout_s`` (send to first output chunk, default 10 s) and
``idle_timeout_s`` (between chunks, default 5 s), ``None`` or 0 for no limit: a drill whose fault
stalls a stream for ``t`` seconds sees it as ``timeout_idle`` only when ``t`` exceeds
``idle_timeout_s``. Every argument is checked before the load starts: a bad or unknown one
interrupts the experiment with one line (``background-load: ...``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from chaoslib.exceptions import InterruptExecution

from chaoslib_infer import settings
from chaoslib_infer.drills.criterion import MIN_REQUESTS
from chaoslib_infer.errors import InferChaosError
from chaoslib_infer.settings import LOAD_ERROR_FILE as LOAD_ERROR_FILE  # re-exported
from chaoslib_infer.settings import WARMUP_FILE as WARMUP_FILE  # re-exported

from .sizing import auto_coverage
from .sizing import baseline_need as baseline_need  # re-exported

__all__ = [
    "after_experiment_control",
    "baseline_need",
    "before_experiment_control",
    "control_arguments",
    "settings_in_force",
    "start_load",
    "stop_load",
    "warmup_finding",
    "warmup_seconds",
]

_RUNNING: dict[str, subprocess.Popen[bytes]] = {}
#: seconds the load goes on after the rollbacks (the "after" window of the verdict)
OBSERVE_AFTER_S = 6.0


#: ok requests the warm-up waits for beyond ``warmup_s`` (up to ``max(warmup_s,
#: BASELINE_PATIENCE_S)`` more seconds): the verdict's baseline minimum plus a margin, so a drill
#: whose load started slowly is not inconclusive for a thin baseline (docs/definitions.md,
#: "Verdicts").
BASELINE_REQUESTS = MIN_REQUESTS["baseline"] + 5
BASELINE_PATIENCE_S = 10.0
#: share of the warm-up's scheduled requests (``rate_rps * warmup_s``) that must have succeeded
#: before it ends: a short warm-up the operator chose is not stretched to 55 requests
WARMUP_SHARE = 0.8


def _count_ok(path: Path) -> int:
    if not path.exists():
        return 0
    ok = 0
    with path.open("rb") as fh:
        for line in fh:
            if b'"ok": true' in line or b'"ok":true' in line:
                ok += 1
    return ok


def start_load(
    rate_rps: float = 8.0,
    warmup_s: float | str = 6.0,
    max_duration_s: float = 300.0,
    max_concurrency: int | None = None,
    max_tokens: int = 24,
    timeout_s: float = 15.0,
    api: str = "chat",
    seed: int | None = None,
    retry_attempts: int = 1,
    retry_backoff_s: float = 0.2,
    attempt_timeout_s: float | None = None,
    profile: list[list[float]] | None = None,
    prompt_mix: str | dict[str, float] | list[list[Any]] | None = None,
    ttft_timeout_s: float | None = 10.0,
    idle_timeout_s: float | None = 5.0,
    retry_on: list[str] | tuple[str, ...] | str | None = None,
    idempotency_header: str | None = None,
    trace: str | None = None,
    trace_speed: float = 1.0,
    baseline_requests: int = BASELINE_REQUESTS,
    configuration: dict[str, Any] | None = None,
    **more: Any,
) -> dict[str, Any]:
    """Start the background load process and wait for its warm-up.

    Args:
        rate_rps: mean open-loop arrival rate (requests/s, Poisson arrivals).
        warmup_s: seconds to let the load run before the first steady-state hypothesis;
            ``"auto"``: long enough for the baseline to catch a 2 % defect (:func:`warmup_seconds`:
            25 s at 8 req/s and 99.9 %), then until that many requests (:func:`~chaoslib_infer.controls.sizing.baseline_need`,
            194) succeeded, within the patience below.
        max_duration_s: hard bound of the load in seconds; it stops by itself after it.
        max_concurrency: cap on logical requests in flight; None (default): from the plan, the
            rate x the request deadline, at least 1000 (``LoadSpec.cap``). A request due while
            it is full is recorded ``not_sent`` (never delayed).
        max_tokens: output tokens asked per request.
        timeout_s: client total timeout per request (seconds).
        api: ``"chat"`` or ``"completions"``.
        seed: arrival schedule seed (``None``: random).
        retry_attempts: total attempts per logical request (1 = no retry).
        retry_backoff_s: base retry backoff in seconds (doubled per retry, +-20% seeded jitter).
        attempt_timeout_s: per-attempt total timeout in seconds (``None``: ``timeout_s``).
        profile: rate phases ``[[duration_s, rate_rps], ...]`` replacing ``rate_rps``; cut at
            ``max_duration_s``.
        prompt_mix: prompt-length mixture, ``"short:70,mid:25,long:5"`` (named classes set the
            prompt words and ``max_tokens``), ``"64:80,2048:20"`` (word counts; ``max_tokens``
            stays), or a mapping ``{class: weight}``; None: 16-word prompts.
        ttft_timeout_s: client limit from send to the first output chunk, seconds (``timeout_ttft``);
            None or 0: no limit.
        idle_timeout_s: client limit between output chunks, seconds (``timeout_idle``); None or
            0: no limit.
        retry_on: the failures a retry follows: error classes, or the groups ``cut_stream`` and
            ``connect_error`` (:data:`chaoslib_infer.load.options.RETRY_ON_GROUPS`); None: the
            client's default (``DEFAULT_RETRY_ON``).
        idempotency_header: a header name sent on every attempt with the logical request id as
            its value (the same on its retries), for a gateway that deduplicates; None: not sent.
        trace: a recorded trace (Mooncake / AIPerf JSONL, :mod:`chaoslib_infer.load.trace`) as
            the arrival schedule and request sizes instead of ``rate_rps``; None: Poisson.
        trace_speed: time scale of the trace (2.0 replays it twice as fast).
        baseline_requests: when fewer requests than ``min(baseline_requests, 0.8 * rate_rps *
            warmup_s)`` (at least 1) have succeeded after ``warmup_s``, wait for them up to
            ``max(warmup_s, 10)`` seconds more, or until the load ends: the verdict needs 50
            requests in the baseline (default 55; the default experiments' 8 s at 8 req/s ask
            for 51); 0: no wait. With a ``profile`` or a ``trace`` (the first phase is the
            baseline, on the load's own clock) it waits for the first success only.
        configuration: Chaos Toolkit configuration (target URL, run directory).
        more: any further load setting of :data:`chaoslib_infer.load.options.LOAD_SETTINGS`
            (a setting added to the table reaches the generator through its row's flag).

    Every load setting (the table's rows, all the arguments above but ``max_duration_s``,
    ``api``, ``trace``, ``trace_speed`` and ``baseline_requests``) is read with
    :func:`~chaoslib_infer.load.options.parse_setting`, so text works as well as numbers
    (``chaos run --var load_retry_attempts=3`` gives ``"3"``).

    Returns:
        ``{"pid", "records", "url", "rate_rps", "profile", "prompt_mix" (text or None),
        "ttft_timeout_s", "idle_timeout_s", "settings", "warmup"}`` (timeouts None when
        unlimited; ``settings``: every load setting in force, ``{name: value}``;
        ``warmup``: the finding of :func:`warmup_finding` when nothing succeeded in the warm-up
        by the service's doing, also written to ``warmup.json`` in the run folder; else None),
        ``"warmup_s"`` and, with ``warmup_s: auto``, ``"warmup_power"``: what the baseline's
        size covers, figure by figure (:func:`chaoslib_infer.controls.sizing.auto_coverage`;
        else None).

    Raises:
        InterruptExecution: bad retry/profile/mix/timeout/warm-up arguments (one line), a
            ``window_*`` setting out of range with ``warmup_s: auto``, no target, the
            load process died, or no request succeeded in the warm-up because the tool could not
            run (nothing sent, every attempt failed to connect: :func:`warmup_finding`).
    """
    from chaoslib_infer.load.client import LoadSpec
    from chaoslib_infer.load.options import LOAD_SETTINGS, load_argv, parse_setting

    given = {
        "rate_rps": rate_rps, "warmup_s": warmup_s, "max_concurrency": max_concurrency,
        "max_tokens": max_tokens, "timeout_s": timeout_s, "seed": seed,
        "retry_attempts": retry_attempts, "retry_backoff_s": retry_backoff_s,
        "attempt_timeout_s": attempt_timeout_s, "profile": profile, "prompt_mix": prompt_mix,
        "ttft_timeout_s": ttft_timeout_s, "idle_timeout_s": idle_timeout_s,
        "retry_on": retry_on, "idempotency_header": idempotency_header, **more,
    }  # fmt: skip
    defaults = {s.name: s.default for s in LOAD_SETTINGS}
    try:
        values = {
            name: parse_setting(name, defaults[name] if v is None and name == "retry_on" else v)
            for name, v in given.items()
        }
        phases_given = values["profile"]
        first_rate = float(phases_given[0][1]) if phases_given else float(values["rate_rps"])
        # auto: the baseline a powered test needs; the warm-up also waits for that many to end
        need = baseline_need(configuration) if values["warmup_s"] == "auto" else 0
        values["warmup_s"] = warmup_seconds(values["warmup_s"], first_rate, configuration)
        fields = {f.name for f in dataclasses.fields(LoadSpec) if f.init}
        checked = {k: v for k, v in values.items() if k in fields and v is not None}
        checked.update(retry_on=tuple(values["retry_on"]), api=api)
        LoadSpec(url="http://127.0.0.1:1", **checked)  # one clear line, not a dead process
    except (ValueError, TypeError) as exc:
        raise InterruptExecution(f"background-load: {exc}") from None
    rate_rps, warmup_s, phases = values["rate_rps"], values["warmup_s"], values["profile"]
    ttft, idle = values["ttft_timeout_s"], values["idle_timeout_s"]
    url = settings.target_url(configuration)
    try:  # `chaos run` reaches here without our CLI: enforce the blast radius here too
        from chaoslib_infer.safety.allowlist import check_target

        check_target(url, configuration=configuration)  # + the game day's infer_allow
    except InferChaosError as exc:
        raise InterruptExecution(str(exc)) from exc
    run_dir = settings.run_dir(configuration)
    records = settings.records_path(configuration)
    cmd = [
        sys.executable,
        "-m",
        "chaoslib_infer.load",
        "--url",
        url,
        "--rate",
        str(rate_rps),
        "--duration-s",
        str(max_duration_s),
        "--out",
        str(records),
        "--api",
        api,
        "--no-locust-stats",  # the drill's evidence writes them, after the scrub
        *load_argv(values),  # every load setting, by its row of the table
    ]
    if trace:
        cmd += ["--trace", str(trace), "--trace-speed", repr(float(trace_speed))]
    (run_dir / WARMUP_FILE).unlink(missing_ok=True)  # an earlier `chaos run` in this folder
    log = (run_dir / "load.log").open("ab")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    _RUNNING[str(run_dir)] = proc
    (run_dir / "load.pid").write_text(str(proc.pid), encoding="utf-8")
    began = time.monotonic()
    deadline = began + float(warmup_s)
    # the verdict needs a baseline of MIN_REQUESTS["baseline"] requests ended before the fault: on
    # a slow start (a loaded machine, a cold engine) the warm-up waits for them, bounded; a rate
    # profile's phases run on the load's own clock, so there it waits for a first success only
    patience = deadline + max(float(warmup_s), BASELINE_PATIENCE_S)
    if phases is not None or trace:
        wanted = min(int(baseline_requests), 1)
    else:  # what the warm-up's own schedule should have completed, at most the verdict's need
        expected = int(WARMUP_SHARE * float(rate_rps) * float(warmup_s))
        wanted = min(int(baseline_requests), max(1, expected))
        wanted = max(wanted, need) if int(baseline_requests) else 0  # 0: no wait, as asked
    while True:
        now = time.monotonic()
        if proc.poll() is not None:
            if now < deadline:
                raise InterruptExecution(
                    f"the load generator exited with code {proc.returncode}; "
                    f"see {run_dir / 'load.log'}"
                )
            break  # a load shorter than the patience: nothing more to wait for
        if now >= patience or (now >= deadline and _count_ok(records) >= wanted):
            break
        time.sleep(0.2)
    finding = None
    if _count_ok(records) == 0:
        tool, finding = warmup_finding(records, time.monotonic() - began)
        if tool:
            stop_load(configuration)
            raise InterruptExecution(
                f"no request to {url} succeeded during the {warmup_s:.0f} s warm-up: {finding}"
            )
        (run_dir / WARMUP_FILE).write_text(
            json.dumps({"finding": finding, "url": url, "warmup_s": float(warmup_s)}),
            encoding="utf-8",
        )
    return {
        "pid": proc.pid,
        "records": str(records),
        "url": url,
        "rate_rps": rate_rps,
        "profile": phases,
        "prompt_mix": values["prompt_mix"],
        "ttft_timeout_s": ttft,
        "idle_timeout_s": idle,
        "settings": values,
        "warmup": finding,
        "warmup_s": warmup_s,
        "warmup_power": auto_coverage(first_rate, configuration) if need else None,
    }


def warmup_seconds(
    warmup_s: float | str, rate_rps: float, configuration: dict[str, Any] | None = None
) -> float:
    """The warm-up in seconds: ``warmup_s`` itself, or for ``"auto"`` the load the baseline
    needs to catch the plan's defect with the plan's power at the plan's false-alarm bound
    (:func:`chaoslib_infer.measure.binomial.window_seconds` against the availability SLO in
    force, ``slo_availability``; the ``window_false_alarm``, ``window_power`` and
    ``window_defect`` settings): 194 requests at 99.9 % and the defaults, 25 s at 8 req/s.
    The baseline the verdict judges runs from the first request to the injection, so it holds
    the warm-up and the first hypothesis's seconds (``docs/definitions.md``, "Windows with
    stated error rates").

    Raises:
        ValueError: ``warmup_s`` neither ``auto`` nor a number >= 0, a rate <= 0 with
            ``auto``, a ``window_*`` or ``slo_availability`` setting out of range (one line).
    """
    if str(warmup_s).strip().lower() != "auto":
        try:
            value = float(warmup_s)
        except (TypeError, ValueError):
            raise ValueError(f"warmup_s={warmup_s!r}: give seconds or auto") from None
        if not value >= 0:
            raise ValueError(f"warmup_s={warmup_s!r}: must be >= 0 seconds")
        return value
    if not rate_rps > 0:
        raise ValueError(f"warmup_s=auto needs a rate above 0 req/s (got {rate_rps})")
    return float(math.ceil(baseline_need(configuration) / rate_rps))


#: Error classes of an attempt that never reached the target: when every attempt of the warm-up
#: ended so, the target is unreachable as configured (the tool's failure, not the service's).
UNREACHABLE = frozenset({"connect", "timeout_connect"})


def warmup_finding(records: Path, waited_s: float) -> tuple[bool, str]:
    """Why no request succeeded during a warm-up of ``waited_s`` seconds, and whose failure it is.

    Reads the records written so far and the load's in-flight snapshot beside them
    (``inflight.json``).

    Args:
        records: the load's records file. waited_s: seconds the warm-up waited.

    Returns:
        ``(tool, line)``: ``tool`` True when the tool could not run (nothing was sent, or every
        attempt failed to connect and none is on the wire), False when the service held or
        failed the requests. ``line`` says what happened: ``"nothing answered in 18 s: 140
        requests sent, 130 still in flight, 10 timeout_ttft"`` when no attempt got an HTTP
        answer, ``"nothing succeeded in 2 s: 16 requests sent, 16 http_5xx"`` when some did.
    """
    from chaoslib_infer.load.inflight import INFLIGHT_FILE
    from chaoslib_infer.load.records import read_records
    from chaoslib_infer.measure.inflight import read_inflight

    try:
        done = read_records(records) if records.exists() else []
    except (OSError, ValueError):
        done = []
    ended = {(r.get("request_id"), r.get("attempt") or 1) for r in done}
    on_wire = [  # the snapshot is up to 0.25 s old: an attempt ended since counts once
        a
        for a in read_inflight(records.with_name(INFLIGHT_FILE))
        if (a["request_id"], a.get("attempt") or 1) not in ended
    ]
    classes: dict[str, int] = {}
    for r in done:
        cls = str(r.get("error_class") or "ok")
        classes[cls] = classes.get(cls, 0) + 1
    sent = len({r.get("request_id") for r in done} | {a["request_id"] for a in on_wire})
    parts = [f"{sent} requests sent"]
    if on_wire:
        parts.append(f"{len(on_wire)} still in flight")
    parts += [f"{n} {cls}" for cls, n in sorted(classes.items(), key=lambda kv: -kv[1])]
    answered = any(r.get("status") is not None for r in done)
    head = "nothing succeeded" if answered else "nothing answered"
    line = f"{head} in {waited_s:.0f} s: " + ", ".join(parts)
    if sent == 0:
        return True, f"the load sent nothing in {waited_s:.0f} s (see load.log)"
    if not on_wire and set(classes) <= UNREACHABLE:
        return True, f"every attempt failed to connect ({line})"
    return False, line


def stop_load(configuration: dict[str, Any] | None = None, grace_s: float = 20.0) -> int | None:
    """Stop the background load of this run (SIGTERM, then SIGKILL after ``grace_s`` seconds).

    Returns:
        The load process's exit code, or ``None`` when no load was running.
    """
    run_dir = settings.run_dir(configuration)
    proc = _RUNNING.pop(str(run_dir), None)
    if proc is None:
        return None
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)
    (run_dir / "load.pid").unlink(missing_ok=True)
    return proc.returncode


def _set_aside_old_fault_log(configuration: dict[str, Any] | None) -> None:
    """Move an earlier run's fault log out of the way (``chaos run`` twice with the same run
    dir: the records file is rewritten, the fault log was appended to, and this run's probes and
    figures judged the earlier run's fault). It becomes ``faults.<unix s>.jsonl`` beside it: the
    evidence is kept, this run's log starts empty. The game day starts each drill in a clean
    folder, so it never has one."""
    log = settings.faults_path(configuration)
    with contextlib.suppress(OSError):
        if log.stat().st_size > 0:
            log.rename(log.with_name(f"faults.{int(log.stat().st_mtime)}.jsonl"))


def control_arguments(
    arguments: dict[str, Any], configuration: dict[str, Any] | None
) -> dict[str, Any]:
    """The arguments :func:`start_load` gets: every load setting the configuration gives as
    ``load_<name>`` (:func:`chaoslib_infer.load.options.load_vars`: an experiment's
    ``configuration:`` with a plan's ``vars:``, ``--load-<name>`` or ``chaos run --var`` over
    it), under the control's own ``arguments``. The shipped experiments give no load setting as
    an argument (each is a ``load_<name>`` key of their configuration), so every override
    reaches them; an argument an experiment writes out wins (write ``"${load_<name>}"`` to
    let the configuration decide). Unknown arguments are kept (:func:`before_experiment_control`
    refuses them).

    Raises:
        ValueError: a configured load setting with a bad value (one line naming ``load_<name>``).
    """
    from chaoslib_infer.load.options import load_vars

    return {**load_vars(configuration or {}), **arguments}


def settings_in_force(
    experiment: dict[str, Any], extra_vars: dict[str, Any] | None = None
) -> dict[str, Any] | None:
    """The load settings a drill would run with, nothing started: the table's defaults, under the
    configuration's ``load_<name>`` keys with ``extra_vars`` (a plan's ``vars:``, the command
    line) over them, under the background-load control's arguments (``${...}`` resolved):
    :func:`control_arguments`.

    Args:
        experiment: the experiment as loaded (a mapping). extra_vars: configuration overrides.

    Returns:
        ``{name: value}`` for every row of :data:`chaoslib_infer.load.options.LOAD_SETTINGS`, or
        None when the experiment has no background-load control or a locustfile drives it.

    Raises:
        ValueError: a setting with a bad value (one line naming it).
    """
    from chaoslib import substitute
    from chaoslib.configuration import load_configuration

    from chaoslib_infer.load.options import LOAD_SETTINGS, parse_setting

    control = next(
        (
            c
            for c in experiment.get("controls") or []
            if (c.get("provider") or {}).get("module") == __name__
        ),
        None,
    )
    if control is None:
        return None
    declared = dict(experiment.get("configuration") or {})
    extra = dict(extra_vars or {})
    declared.update({k: v for k, v in extra.items() if k not in declared})
    try:
        config = load_configuration(declared, dict(extra))
    except Exception as exc:  # chaoslib: an env key without default, not set here
        raise ValueError(f"configuration: {exc}") from None
    arguments = substitute(dict((control.get("provider") or {}).get("arguments") or {}), config, {})
    if arguments.get("engine") == "locust":
        return None
    merged = control_arguments(arguments, config)
    return {
        s.name: parse_setting(s.name, merged[s.name]) if s.name in merged else s.default
        for s in LOAD_SETTINGS
    }


def before_experiment_control(
    context: dict[str, Any],
    configuration: dict[str, Any] | None = None,
    **arguments: Any,
) -> None:
    """Chaos Toolkit hook: start the load before the experiment (arguments of :func:`start_load`,
    over the configuration's ``load_<name>`` keys: :func:`control_arguments`).

    ``engine: locust`` (with ``locustfile``, ``users``, ``spawn_rate``, ``processes``...) runs
    Locust headless instead (:mod:`chaoslib_infer.locust.control`); its closed-loop users are not
    an open-loop schedule, so the coordinated-omission warning applies (stated in ``locust.json``).

    Raises:
        InterruptExecution: an argument :func:`start_load` does not take (a typo would otherwise
            silently run the default), a configured load setting with a bad value, or whatever
            :func:`start_load` raises; the line is also written to ``<run dir>/load_error.txt``.
    """
    from chaoslib_infer.load.options import LOAD_SETTINGS

    _set_aside_old_fault_log(configuration)
    if arguments.get("engine") == "locust":  # a locustfile drives the drill's load
        from chaoslib_infer.locust.control import before_experiment_control as locust_before

        locust_before(context, configuration, **arguments)
        return
    arguments.pop("engine", None)  # "builtin" (the default)
    params = inspect.signature(start_load).parameters
    # observe_after_s is read by after_experiment_control
    allowed = (
        ({n for n, p in params.items() if p.kind is not p.VAR_KEYWORD} - {"configuration"})
        | {"observe_after_s"}
        | {s.name for s in LOAD_SETTINGS}
    )
    with settings.load_error_saved(configuration):
        try:
            arguments = control_arguments(arguments, configuration)
        except ValueError as exc:
            raise InterruptExecution(f"background-load: {exc}") from None
        unknown = sorted(set(arguments) - allowed)
        kwargs = {k: v for k, v in arguments.items() if k in allowed and k != "observe_after_s"}
        if unknown:
            raise InterruptExecution(
                f"background-load: unknown argument(s) {', '.join(unknown)}; "
                f"known: {', '.join(sorted(allowed))}"
            )
        start_load(configuration=configuration, **kwargs)


def after_experiment_control(
    context: dict[str, Any],
    state: Any = None,
    configuration: dict[str, Any] | None = None,
    **arguments: Any,
) -> None:
    """Chaos Toolkit hook: stop the load after the experiment and its rollbacks.

    With ``observe_after_s`` (default :data:`OBSERVE_AFTER_S`) in the control's arguments the
    load goes on that many seconds after the rollbacks, so the verdict can compare the service
    after the drill with its baseline (capacity, P99); skipped when the run was interrupted.
    """
    wait = float(arguments.get("observe_after_s", OBSERVE_AFTER_S) or 0.0)
    status = state.get("status") if isinstance(state, dict) else None
    if wait > 0 and status not in ("interrupted", "aborted"):
        deadline = time.monotonic() + min(wait, 60.0)
        while time.monotonic() < deadline:
            time.sleep(0.2)
    if arguments.get("engine") == "locust":
        from chaoslib_infer.locust.control import stop_locust

        stop_locust(configuration)
        return
    stop_load(configuration)
