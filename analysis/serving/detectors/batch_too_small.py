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
        rows = [(r, w, k, m.scalar("preemptions") or 0.0) for m in ms if (r := m.scalar("running")) is not None
                and (w := m.scalar("waiting")) is not None and (k := m.scalar("kv_usage")) is not None]
        if not rows:
            continue
        cap = max(r for r, _, _, _ in rows)
        # a pinned minute: the batch at its highest, requests waiting, KV room, nothing preempted
        pinned = [(r, w, k) for r, w, k, p in rows
                  if r >= cap - cfg.spread_max and w >= cfg.waiting_min and k <= cfg.kv_max and p == 0]
        if len(pinned) < cfg.min_minutes or cap < cfg.batch_min:
            continue
        running = [r for r, _, _ in pinned]
        out.append(make_finding(view, KIND, cfg, replica, {
            "replica": replica, "batch_size_mean": sum(running) / len(running),
            "batch_size_spread": max(running) - min(running),
            "waiting_mean": sum(w for _, w, _ in pinned) / len(pinned),
            "kv_usage_mean": sum(k for _, _, k in pinned) / len(pinned), "judged_minutes": len(rows),
            "flagged_minutes": len(pinned)}))
    return out


DETECTOR = ServingDetector(KIND, Config, detect)
