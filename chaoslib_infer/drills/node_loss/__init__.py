"""The node-loss drill's room.

Question: When a compute node drops with every replica on it, do the gateway and the orchestrator
move the work to spare capacity, and how long are users interrupted? (``criteria.QUESTION``)

What lives where:

- ``criteria.py``: the question and the acceptance criteria;
- ``actions.py``: actions and rollbacks on the lab: lose_node (cut a node's network, SIGKILL its
  replicas; mechanism :mod:`chaoslib_infer.lab.nodes`);
- ``probes.py``: its probes (replicas_in_service, wait_for_replacements_serving);
- ``k8s.py``: actions and rollbacks on Kubernetes (k8s_drain_model_node / k8s_uncordon_node,
  k8s_taint_model_node / k8s_remove_node_taint, k8s_delete_model_node / k8s_restore_node);
- ``figures.py``: its figures, ground truth and timeline markers (``compute(ctx)``).

Experiments: ``experiments/node-loss.yaml``, ``experiments/k8s/node-loss.yaml``; runbook:
``runbooks/node-loss.md``.
"""
