"""The ``--out`` evidence folder of a run: checked (and made) before anything runs.

Used by the command line (``gameday``, ``drill run``, ``certify``) and by ``chaos-infer load``
(:mod:`chaoslib_infer.cli.load`), so that a bad ``--out`` is refused with one line before any
load or fault.
"""

from __future__ import annotations

from pathlib import Path

from chaoslib_infer.errors import ConfigError

__all__ = ["prepare_out_dir"]


def prepare_out_dir(path: Path, create: bool = True) -> None:
    """Check (and with ``create``, make) an evidence folder before anything runs.

    Args:
        path: the ``--out`` folder.
        create: make it (and its parents); False only checks it is not an existing file.

    Raises:
        ConfigError: the path is empty (``--out ''``: the evidence would land in the current
            folder, mixed with what is there), an existing non-folder, or the folder cannot be
            made.
    """
    if str(path) in ("", "."):
        raise ConfigError("--out '': name a folder for the evidence, not the current folder")
    if path.exists() and not path.is_dir():
        raise ConfigError(f"--out {path}: exists and is not a folder")
    if create:
        try:
            path.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            raise ConfigError(f"--out {path}: cannot create it: {exc.strerror or exc}") from None
