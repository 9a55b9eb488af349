"""The network-jitter drill's room.

Question: When the link to one replica gets slow and irregular, do the client's and the gateway's
retries cause duplicate (twice-paid) generations? (``criteria.QUESTION``)

What lives where:

- ``criteria.py``: the question and the acceptance criteria;
- ``actions.py``: actions and rollbacks on the lab: inject_network_jitter / remove_network_jitter
  (netem or the userspace shim; mechanisms :mod:`chaoslib_infer.lab.netem`,
  :mod:`chaoslib_infer.lab.shim`), and the fault ledger's fault_active / undo_fault;
- ``plumbing.py``: their process and link plumbing (the shim's start, the netem dead-man watchdog
  and how a fault's processes are stopped, the replica's link devices, the ``tc`` argv);
- ``probes.py``: its probes (duplicates_check);
- ``k8s.py``: actions and rollbacks on Kubernetes (k8s_network_jitter / k8s_remove_network_jitter);
- ``figures.py``: its figures, ground truth and timeline markers (``compute(ctx)``).

Experiments: ``experiments/network-jitter.yaml``, ``experiments/k8s/network-jitter.yaml``; runbook:
``runbooks/network-jitter.md``.
"""
