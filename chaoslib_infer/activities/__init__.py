"""Chaos Toolkit actions and probes of chaoslib-infer, one module per concern.

- :mod:`chaoslib_infer.activities.slo`: probes over the live load records (availability, latency
  percentiles, error and timeout rates, the SLO check used by steady-state hypotheses).
- :mod:`chaoslib_infer.activities.lab`: actions and probes against the local lab (OOM kill, wait for a
  replica to serve again, clear faults).
"""
