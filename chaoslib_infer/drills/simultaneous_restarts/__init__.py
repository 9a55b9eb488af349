"""The simultaneous-restarts drill's room.

Question: When several replicas restart at once, does the gateway pour all traffic onto the
survivors, and can they carry it until every restarted replica serves again?
(``criteria.QUESTION``)

What lives where:

- ``criteria.py``: the question and the acceptance criteria;
- ``actions.py``: actions and rollbacks on the lab: restart_replicas (mechanism
  :mod:`chaoslib_infer.lab.restarts`);
- ``k8s.py``: actions and rollbacks on Kubernetes (k8s_simultaneous_restarts);
- ``figures.py``: its figures, ground truth and timeline markers (``compute(ctx)``).

Experiments: ``experiments/simultaneous-restarts.yaml``,
``experiments/k8s/simultaneous-restarts.yaml``;
runbook: ``runbooks/simultaneous-restarts.md``.
"""
