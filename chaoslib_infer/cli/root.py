"""The ``chaos-infer`` click group; the commands are added in :mod:`chaoslib_infer.cli`."""

from __future__ import annotations

import click

from chaoslib_infer import __version__

from .usage import OneLineGroup

__all__ = ["main"]


@click.group(
    cls=OneLineGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(__version__, prog_name="chaos-infer")
def main() -> None:
    """Chaos and disaster-recovery drills for LLM inference services.

    \b
    Start here:
      chaos-infer gameday --out gameday-out     bring up the local lab, run the default
                                                game day (drills/gameday.yaml), take it down
      chaos-infer lab up --replicas 3           keep a lab running to drive it by hand or
      chaos --no-version-check run experiments/oom-kill.yaml    with the Chaos Toolkit CLI
      chaos-infer capacity --peak-qps 200 --latency-s 1 --concurrency 20 --redundancy 0.7

    Evidence (summary.json, index.html, per-drill evidence.md/.html with a timeline plot, the
    Chaos Toolkit journal and one record per request) lands in the --out folder.
    """
    import os

    os.umask(0o077)  # run files hold server text: 0600 files, 0700 folders (docs/safety.md)
