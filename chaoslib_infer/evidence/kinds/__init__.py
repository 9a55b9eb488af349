"""Figures of the fault kinds that are no drill's own (engine faults, the Kubernetes actions and
observation, scale-out): module ``<kind>`` (dashes as underscores) exposes
``compute(ctx: DrillContext) -> tuple[dict, dict]`` returning ``(figures, ground_truth)``. They are
found through :data:`chaoslib_infer.evidence.figures.OTHER_KINDS`; a drill's own figures live in its
room (``chaoslib_infer/drills/<drill>/figures.py``)."""
