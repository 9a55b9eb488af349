"""``chaos-infer``: the command line of chaoslib-infer (thin: parse, call the library, print, exit).

One module per command group: :mod:`.gameday`, :mod:`.drill` (list, run), :mod:`.lab` (up,
status, down), :mod:`.rollback`, :mod:`.report`, :mod:`.sizing` (capacity, alerts),
:mod:`.schedule`, :mod:`.certify`, :mod:`.history` and :mod:`.load`;
:mod:`.plan_run` runs a plan for gameday and drill run, :mod:`.common` holds what they share.
``main`` (the click group, :mod:`.root`) is the console script ``chaos-infer`` and
``python -m chaoslib_infer.cli``.

Exit codes everywhere: 0 success / every hypothesis held, 1 a drill deviated, 2 bad input or
unreachable target (one clear line on stderr, no traceback), 130 interrupted.
"""

from __future__ import annotations

from .certify import certify
from .drill import drill
from .gameday import gameday
from .history import history
from .lab import describe_engine_fault, lab, lab_up, lab_up_kwargs
from .load import load_group
from .report import report
from .rollback import rollback
from .root import main
from .schedule import schedule
from .sizing import alerts, capacity

__all__ = ["describe_engine_fault", "lab_up", "lab_up_kwargs", "main"]

for _command in (
    gameday,
    drill,
    lab,
    rollback,
    report,
    capacity,
    alerts,
    schedule,
    certify,
    history,
):
    main.add_command(_command)
main.add_command(load_group)  # `chaos-infer load ...`
