"""The upstream-timeout drill's room.

Question: When one model server stops answering but keeps its socket open, does the service fail
fast and route around it, or wait until its clients give up? (``criteria.QUESTION``)

What lives where:

- ``criteria.py``: the question and the acceptance criteria;
- ``actions.py``: actions and rollbacks on the lab: freeze_replica / thaw_replicas (mechanism
  :mod:`chaoslib_infer.lab.freeze`; the gateway sampled meanwhile by the shared
  :mod:`chaoslib_infer.lab.gateway_sampler`);
- ``k8s.py``: actions and rollbacks on Kubernetes (k8s_freeze_model_server /
  k8s_thaw_model_server; the variant k8s_block_pod_ingress / k8s_restore_pod_ingress, a
  NetworkPolicy);
- ``figures.py``: its figures, ground truth and timeline markers (``compute(ctx)``).

Experiments: ``experiments/upstream-timeout.yaml``, ``experiments/k8s/upstream-timeout.yaml``;
runbook: ``runbooks/upstream-timeout.md``.
"""
