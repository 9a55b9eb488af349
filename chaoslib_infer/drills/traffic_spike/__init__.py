"""The traffic-spike drill's room.

Question: When traffic jumps to twice the peak, how fast does the service scale out, does it shed
early with 429/503 rather than let requests time out, and is it back in its bands after?
(``criteria.QUESTION``)

What lives where:

- ``criteria.py``: the question and the acceptance criteria;
- ``actions.py``: actions and rollbacks on the lab: inject_traffic_spike, wait_for_spike_over
  (mechanism :mod:`chaoslib_infer.lab.scaling`);
- Kubernetes: none of its own: the spike is the load profile; the scale-out is observed by
  :mod:`chaoslib_infer.activities.k8s_observe`;
- ``figures.py``: its figures, ground truth and timeline markers (``compute(ctx)``).

Experiments: ``experiments/traffic-spike.yaml``, ``experiments/k8s/traffic-spike.yaml``; runbook:
``runbooks/traffic-spike.md``.
"""
