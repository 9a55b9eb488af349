"""Figures of the ``k8s-scale-out`` fault-log line (``k8s_wait_scale_out``, traffic-spike on
Kubernetes): see :func:`chaoslib_infer.evidence.kinds.k8s_observation.compute_scale_out`. Its
``fault_at`` is the spike start."""

from __future__ import annotations

from chaoslib_infer.evidence.kinds.k8s_observation import compute_scale_out as compute
from chaoslib_infer.evidence.kinds.k8s_observation import scale_out_markers as markers

__all__ = ["LEDGER_LABELS", "compute", "markers"]

LEDGER_LABELS = ("spike starts", "spike ends")
