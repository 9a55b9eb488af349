"""Chaos Toolkit actions and probes that are no single drill's own, one module per concern.

A drill's own actions, probes and Kubernetes actions live in its room
(``chaoslib_infer/drills/<drill>/``, see :mod:`chaoslib_infer.drills`). Here:

- :mod:`chaoslib_infer.activities.slo`: probes over the live load records (availability, latency
  percentiles, error and timeout rates, the SLO check used by steady-state hypotheses);
- :mod:`chaoslib_infer.activities.criteria`, :mod:`~chaoslib_infer.activities.health`,
  :mod:`~chaoslib_infer.activities.prometheus`, :mod:`~chaoslib_infer.activities.gpu`: the other
  shared probes;
- :mod:`chaoslib_infer.activities.lab`: the shared rollback ``clear_lab_faults``;
  :mod:`~chaoslib_infer.activities.engine_faults`, :mod:`~chaoslib_infer.activities.k8s_observe`;
- helpers the rooms share: :mod:`~chaoslib_infer.lab.activity`,
  :mod:`~chaoslib_infer.platforms.kubernetes.activity`, :mod:`~chaoslib_infer.lab.gateway_sampler`;
- compatibility aliases of the moved modules (``capacity``, ``k8s``, ``lab_probes``, ``network``,
  ``network_probes``, ``node_loss``, ``node_loss_probes``, ``restarts``, ``upstream``):
  :data:`chaoslib_infer.COMPAT_MODULES`.
"""
