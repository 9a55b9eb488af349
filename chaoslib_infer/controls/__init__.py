"""Chaos Toolkit controls of chaoslib-infer (``controls:`` entries of an experiment)."""
