"""Imports every scenario module so ``model.REGISTRY`` is complete."""

from __future__ import annotations

from . import (  # noqa: F401  (registration happens at import)
    scenarios_borderline,
    scenarios_coverage,
    scenarios_faults,
    scenarios_hpc,
    scenarios_serving,
    scenarios_training,
    scenarios_verdicts,
    scenarios_waste,
)
from .model import REGISTRY, Scenario

__all__ = ["REGISTRY", "Scenario"]
