"""One room per drill: everything that is one drill's own lives in its package.

Each ``chaoslib_infer/drills/<drill>/`` holds:

- ``criteria.py``: the drill's question (``QUESTION``) and acceptance criteria (``CRITERIA``);
- ``actions.py``: its Chaos Toolkit actions and rollbacks on the lab (and ``probes.py``, its probes,
  where it has its own);
- ``k8s.py``: its actions and rollbacks on Kubernetes;
- ``figures.py``: its figures, ground truth and timeline markers (``compute(ctx)``).

:mod:`chaoslib_infer.drills.registry` maps each drill name to its room, criteria, figures,
experiments and runbook. The substrate the drills share is used through public interfaces: the lab
(:mod:`chaoslib_infer.lab`), the Kubernetes plumbing (:mod:`chaoslib_infer.platforms.kubernetes`),
the shared activities (:mod:`chaoslib_infer.activities`), measure, evidence, safety.
"""
