"""The safety net of a drill (see ``docs/safety.md``).

- :mod:`~chaoslib_infer.safety.ledger`: the rollback ledger (the lab's ``faults.json``) and
  ``chaos-infer rollback``;
- :mod:`~chaoslib_infer.safety.deadman`: the lab's watchdog that undoes faults past their TTL;
- :mod:`~chaoslib_infer.safety.guard`: stop conditions (availability floor, error-budget burn),
  run by the Chaos Toolkit control :mod:`chaoslib_infer.controls.guard`;
- :mod:`~chaoslib_infer.safety.allowlist`: the targets a game day may touch (loopback by default);
- :mod:`~chaoslib_infer.safety.redact`: secrets kept out of every file a run writes;
- :mod:`~chaoslib_infer.safety.testfault`: the smallest real faults, for testing all of the above.
"""
