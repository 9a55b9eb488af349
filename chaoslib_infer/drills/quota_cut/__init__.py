"""The quota-cut drill's room.

Question: When the instances allowed drop to the capacity plan's minimum, does that count still
carry the online load within the SLOs? (``criteria.QUESTION``)

What lives where:

- ``criteria.py``: the question and the acceptance criteria;
- ``actions.py``: actions and rollbacks on the lab: cut_replica_quota (mechanism
  :mod:`chaoslib_infer.lab.scaling`);
- ``k8s.py``: actions and rollbacks on Kubernetes (k8s_cut_quota / k8s_restore_quota);
- ``figures.py``: its figures, ground truth and timeline markers (``compute(ctx)``).

Experiments: ``experiments/quota-cut.yaml``, ``experiments/k8s/quota-cut.yaml``; runbook:
``runbooks/quota-cut.md``.
"""
