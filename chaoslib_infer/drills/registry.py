"""The drills' registry: drill name -> its room, question, criteria, figures, experiments, runbook.

One row per drill of the seven-item list, each pointing into its room
(``chaoslib_infer/drills/<drill>/``). Everything that maps a drill name to its code or files reads
this table: :mod:`chaoslib_infer.verdict.criteria` (each drill's own criteria),
:func:`chaoslib_infer.evidence.figures.kind_module` (each drill's figures),
:mod:`chaoslib_infer.plan` (which plan entries are drills), ``chaos-infer drill list|run`` and
:func:`chaoslib_infer.evidence.runbooks.fill_runbooks` (each drill's experiment and runbook). The
file paths are relative to the checkout's root (``experiments/``, ``runbooks/``):
:func:`Drill.path` resolves one against a root, :func:`Drill.path_in` against a stand-in for its
top folder (``$CHAOS_INFER_EXPERIMENTS``, a runbooks folder).

Importing this module imports each room's ``criteria`` and ``figures`` modules (not its actions,
which need the Chaos Toolkit).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from types import MappingProxyType, ModuleType

from chaoslib_infer.drills import (
    network_jitter,
    node_loss,
    oom_kill,
    quota_cut,
    simultaneous_restarts,
    traffic_spike,
    upstream_timeout,
)
from chaoslib_infer.drills.criterion import Criterion
from chaoslib_infer.drills.network_jitter import criteria as network_jitter_criteria
from chaoslib_infer.drills.network_jitter import figures as network_jitter_figures
from chaoslib_infer.drills.node_loss import criteria as node_loss_criteria
from chaoslib_infer.drills.node_loss import figures as node_loss_figures
from chaoslib_infer.drills.oom_kill import criteria as oom_kill_criteria
from chaoslib_infer.drills.oom_kill import figures as oom_kill_figures
from chaoslib_infer.drills.quota_cut import criteria as quota_cut_criteria
from chaoslib_infer.drills.quota_cut import figures as quota_cut_figures
from chaoslib_infer.drills.simultaneous_restarts import criteria as simultaneous_restarts_criteria
from chaoslib_infer.drills.simultaneous_restarts import figures as simultaneous_restarts_figures
from chaoslib_infer.drills.traffic_spike import criteria as traffic_spike_criteria
from chaoslib_infer.drills.traffic_spike import figures as traffic_spike_figures
from chaoslib_infer.drills.upstream_timeout import criteria as upstream_timeout_criteria
from chaoslib_infer.drills.upstream_timeout import figures as upstream_timeout_figures

__all__ = ["DRILLS", "Drill", "drill_names"]


@dataclass(frozen=True)
class Drill:
    """One drill's row.

    Attributes:
        name: the drill's name (``oom-kill``), also its fault kind in ``faults.jsonl``.
        room: the room's package (``chaoslib_infer.drills.oom_kill``).
        question: the one question the drill answers.
        criteria: its own acceptance criteria (the common ones are added by
            :func:`chaoslib_infer.verdict.criteria.criteria_for`).
        dropped_common: common criteria this drill does not judge.
        figures: its figures module (``compute(ctx)``, ``markers``, ``LEDGER_LABELS`` ...).
        lab_experiment: the lab's Chaos Toolkit experiment, relative to the checkout.
        k8s_experiment: the Kubernetes experiment, relative to the checkout.
        runbook: the runbook, relative to the checkout.
    """

    name: str
    room: ModuleType
    question: str
    criteria: tuple[Criterion, ...]
    dropped_common: frozenset[str]
    figures: ModuleType
    lab_experiment: PurePosixPath
    k8s_experiment: PurePosixPath
    runbook: PurePosixPath

    def path(self, root: Path, what: str) -> Path:
        """``root / <what>`` for ``what`` in ``lab_experiment``, ``k8s_experiment``, ``runbook``.

        Raises:
            ValueError: ``what`` names none of the three.
        """
        if what not in ("lab_experiment", "k8s_experiment", "runbook"):
            raise ValueError(f"{what!r}: expected lab_experiment, k8s_experiment or runbook")
        rel: PurePosixPath = getattr(self, what)
        return root / rel

    def path_in(self, folder: Path, what: str) -> Path:
        """``what``'s file under ``folder`` standing in for its top folder (``experiments/`` for
        the experiments, ``runbooks/`` for the runbook): oom-kill's ``k8s_experiment`` in ``/x``
        (``$CHAOS_INFER_EXPERIMENTS``) is ``/x/k8s/oom-kill.yaml``.

        Raises:
            ValueError: ``what`` names none of ``lab_experiment``, ``k8s_experiment``,
                ``runbook``.
        """
        rel = self.path(Path(), what).parts
        return folder.joinpath(*rel[1:])


def _row(name: str, room: ModuleType, criteria: ModuleType, figures: ModuleType) -> Drill:
    return Drill(
        name=name,
        room=room,
        question=criteria.QUESTION,
        criteria=tuple(criteria.CRITERIA),
        dropped_common=frozenset(criteria.DROPPED_COMMON),
        figures=figures,
        lab_experiment=PurePosixPath("experiments") / f"{name}.yaml",
        k8s_experiment=PurePosixPath("experiments/k8s") / f"{name}.yaml",
        runbook=PurePosixPath("runbooks") / f"{name}.md",
    )


#: Drill name -> its row, in the order of the seven-item list's game day.
DRILLS: Mapping[str, Drill] = MappingProxyType(
    {
        d.name: d
        for d in (
            _row("node-loss", node_loss, node_loss_criteria, node_loss_figures),
            _row("oom-kill", oom_kill, oom_kill_criteria, oom_kill_figures),
            _row("network-jitter", network_jitter, network_jitter_criteria, network_jitter_figures),
            _row("traffic-spike", traffic_spike, traffic_spike_criteria, traffic_spike_figures),
            _row(
                "upstream-timeout",
                upstream_timeout,
                upstream_timeout_criteria,
                upstream_timeout_figures,
            ),
            _row(
                "simultaneous-restarts",
                simultaneous_restarts,
                simultaneous_restarts_criteria,
                simultaneous_restarts_figures,
            ),
            _row("quota-cut", quota_cut, quota_cut_criteria, quota_cut_figures),
        )
    }
)


def drill_names() -> list[str]:
    """The drills' names, in the registry's order."""
    return list(DRILLS)
