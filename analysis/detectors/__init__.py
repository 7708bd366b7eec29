"""The detectors, one module per flag kind, in explanation order.

Order matters where one kind explains another: the specific causes run first, and the
generic ``low_sm_activity`` steps aside in the windows they flagged (it reads ``found``).
The report lists findings in this order. Adding a kind: an entry in
``gpufleet/flagkinds.toml``, a module here with ``KIND``/``Config``/``detect``, one line in
``DETECTORS``, its thresholds section, and its tests (docs/goodput.md, "Adding a flag kind")."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..config import Thresholds
from ..features import MinuteFeatures, minute_features
from . import (
    collective_slow,
    comm_bound,
    crash_loop,
    hung,
    hw_fault,
    idle_gpu,
    input_stall,
    link_errors,
    low_sm_activity,
    memory_underuse,
    network_degraded,
    no_tensor_cores,
    oversized_allocation,
    pipeline_imbalance,
    straggler,
    throttled,
)
from .base import DetectorSpec, Finding, Found, JobContext, JobView, Signals


def _spec(module: Any) -> DetectorSpec[Any]:
    return DetectorSpec(module.KIND, module.Config, module.detect, getattr(module, "SIGNALS", Signals()))


DETECTORS: tuple[DetectorSpec[Any], ...] = tuple(_spec(m) for m in (
    idle_gpu, oversized_allocation, hung, comm_bound, input_stall, memory_underuse, straggler, pipeline_imbalance,
    throttled,
    no_tensor_cores, low_sm_activity, hw_fault, crash_loop, collective_slow, network_degraded, link_errors,
))


def features_for(th: Thresholds, ts: np.ndarray, gpu: np.ndarray, cols: dict[str, np.ndarray], n_gpus: int,
                 b0: int | None = None) -> MinuteFeatures:
    """``minute_features`` with the options the detectors' thresholds fix (busy level, the
    throttle reasons that count, the critical XIDs): the one way runner, bench and tests call it."""
    return minute_features(ts, gpu, cols, n_gpus, busy_sm_active=th.general.busy_sm_active,
                           throttle_mask=th.get(throttled.Config).reasons_mask,
                           critical_xids=th.get(hw_fault.Config).critical_xids, b0=b0)


def run_detectors(job: JobView) -> Found:
    """Every detector in order; the findings and which kinds abstained for lack of signals."""
    found = Found()
    for d in DETECTORS:
        found.findings.extend(d.run(job, found))
    return found


__all__ = ["DETECTORS", "DetectorSpec", "Finding", "Found", "JobContext", "JobView", "features_for", "run_detectors"]
