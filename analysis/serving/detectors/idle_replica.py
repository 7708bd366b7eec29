"""idle_replica: a replica held its GPUs for a long stretch while it served (almost) nothing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..config import ServingKindConfig
from .base import DeploymentView, ServingDetector, ServingFinding, longest_run, make_finding

KIND = "idle_replica"


@dataclass(frozen=True, kw_only=True)
class Config(ServingKindConfig):
    SECTION: ClassVar[str] = KIND
    requests_per_minute: float


def detect(view: DeploymentView, cfg: Config) -> list[ServingFinding]:
    out = []
    for replica, ms in view.replicas.items():
        known = [m for m in ms if m.scalar("requests") is not None]  # no counter: not judged (unknown)
        idle = [(m.scalar("requests") or 0.0) < cfg.requests_per_minute for m in known]
        run = longest_run(idle)
        if run < cfg.min_minutes:
            continue
        served = [m.scalar("requests") or 0.0 for m, i in zip(known, idle, strict=True) if i]
        out.append(make_finding(view, KIND, cfg, replica, {
            "replica": replica, "requests_per_minute": sum(served) / len(served), "gpus": max(m.gpus for m in ms),
            "idle_minutes": run, "threshold_requests_per_minute": cfg.requests_per_minute,
            "flagged_minutes": sum(idle), "judged_minutes": len(known)}))
    return out


DETECTOR = ServingDetector(KIND, Config, detect)
