"""The safety rules every layer applies (see ``docs/safety.md``); this package imports nothing of
the project but :mod:`chaoslib_infer.errors`, so the load, the measures, the lab and the platforms
all use it (issue 22: it sits under them).

- :mod:`~chaoslib_infer.safety.guard`: stop conditions (availability floor, error-budget burn),
  run by the Chaos Toolkit control :mod:`chaoslib_infer.controls.guard`;
- :mod:`~chaoslib_infer.safety.allowlist`: the targets a game day may touch (loopback by default);
- :mod:`~chaoslib_infer.safety.redact`: secrets kept out of every file a run writes;
- :mod:`~chaoslib_infer.safety.signals`: SIGINT/SIGTERM held across a change and its record.

The lab's own safety net lives with the lab: the fault ledger (:mod:`chaoslib_infer.lab.ledger`,
:mod:`chaoslib_infer.lab.registry`, :mod:`chaoslib_infer.lab.ledger_fields`), its dead-man watchdog
(:mod:`chaoslib_infer.lab.deadman`) and the test faults (:mod:`chaoslib_infer.lab.testfault`);
the Kubernetes bystander preflight and rollback replay are :mod:`chaoslib_infer.k8s_preflight` and
:mod:`chaoslib_infer.k8s_replay` (they read the drills' Kubernetes actions).
"""
