"""``gameday`` / ``drill run``: an ``--out`` folder that already holds files is refused.

A run writes its bundle into ``--out`` and hashes everything there into ``SHA256SUMS``: old files
would stay, be listed as evidence of the new run, and the folder would be made private (0700)
under its owner's feet. So a folder with files in it is refused with one line, before anything
runs (``--dry-run`` says a real run would refuse it).

One folder is taken up again on purpose: the ``--out`` of a run that was killed outright and left
something to undo (pending fault records in ``DIR/lab``, its lab still running, saved Kubernetes
states in ``DIR/*/k8s-state/``). The next game day with that ``--out`` undoes them before its
first drill and says so (README, "Kubernetes"; ``chaos-infer rollback`` does the same by hand).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["files_in", "killed_run_leftovers", "out_folder_refusal"]


def files_in(folder: Path) -> int:
    """How many files (anything but a folder, at any depth) ``folder`` holds; 0 when absent."""
    if not folder.is_dir():
        return 0
    return sum(1 for p in folder.rglob("*") if not p.is_dir())


def killed_run_leftovers(out_dir: Path) -> bool:
    """Whether ``out_dir`` holds what a killed run left to undo: saved Kubernetes states,
    pending fault records of its lab, or its lab still running. A ledger or state that cannot be
    read counts (the run's own recovery then says what is wrong with it)."""
    from chaoslib_infer.k8s_replay import find_pending
    from chaoslib_infer.lab.fleet import LAB_FILE, Lab, LabError
    from chaoslib_infer.lab.ledger import pending_faults

    lab_dir = out_dir / "lab"
    try:
        if find_pending(out_dir):
            return True
        if not (lab_dir / LAB_FILE).exists():
            return False
        return bool(pending_faults(lab_dir)) or Lab.attach(lab_dir).supervisord_alive()
    except (LabError, OSError, ValueError):
        return True


def out_folder_refusal(out_dir: Path) -> str | None:
    """The one line refusing ``out_dir`` (``--out DIR: folder is not empty (N files); choose a
    new folder``), or None when it may be used: absent, without files, or a killed run's folder
    with something to undo (:func:`killed_run_leftovers`)."""
    n = files_in(out_dir)
    if n == 0 or killed_run_leftovers(out_dir):
        return None
    return f"--out {out_dir}: folder is not empty ({n} file{'' if n == 1 else 's'}); choose a new folder"
