"""One room per drill: everything that is one drill's own lives in its package.

Each ``chaoslib_infer/drills/<drill>/`` holds:

- ``criteria.py``: the drill's question (``QUESTION``) and acceptance criteria (``CRITERIA``);
- ``actions.py``: its Chaos Toolkit actions and rollbacks on the lab (and ``probes.py``, its probes,
  where it has its own);
- ``k8s.py``: its actions and rollbacks on Kubernetes. Each fault saves its rollback data before
  injecting (``k8s-state/<kind>.json``, :func:`chaoslib_infer.platforms.kubernetes.activity.save_state`)
  and appends its lines to the drill's fault log; :mod:`chaoslib_infer.activities.k8s`
  re-exports these actions under their historical module;
- ``figures.py``: its figures, ground truth and timeline markers (``compute(ctx)``).

:mod:`chaoslib_infer.drills.registry` maps each drill name to its room, criteria, figures,
experiments and runbook. The substrate the drills share is used through public interfaces: the lab
(:mod:`chaoslib_infer.lab`), the Kubernetes plumbing (:mod:`chaoslib_infer.platforms.kubernetes`),
the shared activities (:mod:`chaoslib_infer.activities`), measure, evidence, safety.
"""

from __future__ import annotations

from typing import Any

__all__ = ["is_k8s_actions_module"]


def is_k8s_actions_module(module: Any) -> bool:
    """True for a module that holds this project's Kubernetes fault actions: a drill room's
    ``chaoslib_infer.drills.<drill>.k8s`` or the compatibility alias
    ``chaoslib_infer.activities.k8s`` (experiments may name either)."""
    if not isinstance(module, str):
        return False
    if module == "chaoslib_infer.activities.k8s":
        return True
    parts = module.split(".")
    return len(parts) == 4 and parts[:2] == ["chaoslib_infer", "drills"] and parts[3] == "k8s"
