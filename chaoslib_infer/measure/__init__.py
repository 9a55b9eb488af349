"""Measurement over load records (contracts.md section 4).

Modules: ``metrics`` (``window_stats``, ``per_second_series``, ``per_replica_share``), ``slo``
(``Thresholds``, ``evaluate``), ``figures`` (interruption, restart, warm-up, duplicates, recovery).
"""
