"""batch_too_small: requests queue while the batch stays pinned at a cap and the KV cache has room
(SGLang's tuning guide: token usage low with a non-empty queue means the server admits too few)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..config import ServingKindConfig
from .base import DeploymentView, ServingDetector, ServingFinding, make_finding

KIND = "batch_too_small"


@dataclass(frozen=True, kw_only=True)
class Config(ServingKindConfig):
    SECTION: ClassVar[str] = KIND
    waiting_min: float
    kv_max: float
    spread_max: float
    batch_min: float


def detect(view: DeploymentView, cfg: Config) -> list[ServingFinding]:
    out = []
    for replica, ms in view.replicas.items():
        rows = [(r, w, k) for m in ms if (r := m.scalar("running")) is not None
                and (w := m.scalar("waiting")) is not None and (k := m.scalar("kv_usage")) is not None]
        if len(rows) < cfg.min_minutes:
            continue
        running = [r for r, _, _ in rows]
        waiting = sum(w for _, w, _ in rows) / len(rows)
        kv = sum(k for _, _, k in rows) / len(rows)
        batch = sum(running) / len(running)
        spread = max(running) - min(running)
        preempted = sum(m.scalar("preemptions") or 0.0 for m in ms)
        if (waiting >= cfg.waiting_min and kv <= cfg.kv_max and spread <= cfg.spread_max
                and batch >= cfg.batch_min and preempted == 0):
            out.append(make_finding(view, KIND, cfg, replica, {
                "replica": replica, "batch_size_mean": batch, "batch_size_spread": spread, "waiting_mean": waiting,
                "kv_usage_mean": kv, "judged_minutes": len(rows), "flagged_minutes": len(rows)}))
    return out


DETECTOR = ServingDetector(KIND, Config, detect)
