"""The detectors that judge a job's own progress, one module per flag kind whose registry
entry says ``source = "progress"`` (gpufleet/flagkinds.toml). Adding one: the registry entry,
a module here with ``KIND``/``Config``/``detect``, one line in ``PROGRESS_DETECTORS``, its
thresholds section and its tests (docs/goodput.md, "Adding a flag kind"). ``hung`` is a
hardware kind: the progress gives it a second kind of evidence (``analysis/progress/detect.py``)."""

from __future__ import annotations

from typing import Any

from . import checkpoint_overhead, restart_lost_progress, slow_rank, startup_overhead, step_time_regression
from .base import ClockAt, ProgressContext, ProgressDetectorSpec, ProgressFinding


def _spec(module: Any) -> ProgressDetectorSpec[Any]:
    return ProgressDetectorSpec(module.KIND, module.Config, module.detect)


PROGRESS_DETECTORS: tuple[ProgressDetectorSpec[Any], ...] = tuple(_spec(m) for m in (
    step_time_regression, slow_rank, restart_lost_progress, checkpoint_overhead, startup_overhead,
))

__all__ = ["PROGRESS_DETECTORS", "ClockAt", "ProgressContext", "ProgressDetectorSpec", "ProgressFinding"]
