"""The serving detectors (flag kinds with source = "serving" in gpufleet/flagkinds.toml), one module
per kind, each a pure function of a deployment's replica-minutes (docs/serving.md)."""

from __future__ import annotations

from typing import Any

from ..config import build, load_raw
from . import batch_too_small, engine_hw_disagree, idle_replica, overprovisioned_deployment, slo_missed
from .base import DeploymentView, ServingDetector, ServingFinding

SERVING_DETECTORS: tuple[ServingDetector, ...] = (
    idle_replica.DETECTOR, overprovisioned_deployment.DETECTOR, slo_missed.DETECTOR, batch_too_small.DETECTOR,
    engine_hw_disagree.DETECTOR)

__all__ = ["SERVING_DETECTORS", "DeploymentView", "ServingFinding", "detect_serving"]


def detect_serving(view: DeploymentView, raw: dict[str, Any] | None = None) -> list[ServingFinding]:
    """Every serving finding for the deployment (thresholds from ``raw`` or analysis/serving/thresholds.toml)."""
    th = raw if raw is not None else load_raw()
    out: list[ServingFinding] = []
    for d in SERVING_DETECTORS:
        out += d.detect(view, build(d.config, th))
    return out
