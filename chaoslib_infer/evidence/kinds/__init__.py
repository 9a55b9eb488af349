"""Per-fault figure functions: module ``<kind>`` (dashes as underscores) exposes
``compute(ctx: DrillContext) -> tuple[dict, dict]`` returning ``(figures, ground_truth)``."""
