"""The oom-kill drill's room.

Question: When the kernel OOM-kills one model server, is it restarted and routed around meanwhile,
and how slow is its first request after the restart? (``criteria.QUESTION``)

What lives where:

- ``criteria.py``: the question and the acceptance criteria;
- ``actions.py``: actions and rollbacks on the lab: oom_kill_replica (a memory hog in the replica's
  cgroup; mechanism :mod:`chaoslib_infer.lab.hog`); rollback: the shared
  :func:`chaoslib_infer.activities.lab.clear_lab_faults`;
- ``probes.py``: wait_for_replica_serving (the killed replica serves again, from the lab's ground
  truth);
- ``k8s.py``: actions and rollbacks on Kubernetes (k8s_oom_kill / k8s_stop_memory_hog);
- ``figures.py``: its figures, ground truth and timeline markers (``compute(ctx)``).

Experiments: ``experiments/oom-kill.yaml``, ``experiments/k8s/oom-kill.yaml``; runbook:
``runbooks/oom-kill.md``.
"""
