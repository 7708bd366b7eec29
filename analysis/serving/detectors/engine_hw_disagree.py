"""engine_hw_disagree: the engine reports a full batch while its GPUs' SMs idle, or the GPUs are
busy while the engine runs nothing (a wrong endpoint, another process on the GPUs)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..config import ServingKindConfig
from .base import DeploymentView, ServingDetector, ServingFinding, make_finding

KIND = "engine_hw_disagree"


@dataclass(frozen=True, kw_only=True)
class Config(ServingKindConfig):
    SECTION: ClassVar[str] = KIND
    batch_min: float
    sm_active_max: float
    busy_sm_active: float


def detect(view: DeploymentView, cfg: Config) -> list[ServingFinding]:
    out = []
    for replica, ms in view.replicas.items():
        rows = [(r, m.sm_active) for m in ms if (r := m.scalar("running")) is not None and m.sm_active is not None]
        if len(rows) < cfg.min_minutes:
            continue
        batch = sum(r for r, _ in rows) / len(rows)
        sm = sum(s for _, s in rows) / len(rows)
        cause = None
        if batch >= cfg.batch_min and sm < cfg.sm_active_max:
            cause = "full_batch_idle_gpus"
        elif max(r for r, _ in rows) == 0 and sm >= cfg.busy_sm_active:
            cause = "busy_gpus_idle_engine"
        if cause:
            out.append(make_finding(view, KIND, cfg, replica, {
                "cause": cause, "replica": replica, "batch_size_mean": batch, "sm_active_mean": sm,
                "judged_minutes": len(rows), "flagged_minutes": len(rows)}))
    return out


DETECTOR = ServingDetector(KIND, Config, detect)
