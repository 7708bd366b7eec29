"""Restarts redo many steps: the checkpoint interval Young/Daly's rule would suggest from the
job's own failures (sqrt(2 x checkpoint cost x MTBF))."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ...config import KindConfig
from .base import ProgressContext, ProgressFinding, finding, r
from .checkpoints import checkpoint_evidence, extent

KIND = "restart_lost_progress"


@dataclass(frozen=True, kw_only=True)
class Config(KindConfig):
    SECTION: ClassVar[str] = KIND
    min_share: float  # restart_lost over the allocated time


def detect(ctx: ProgressContext, cfg: Config) -> list[ProgressFinding]:
    g = ctx.goodput
    a, lost = g.allocated_s, g.badput_s.get("restart_lost", 0.0)
    if a <= 0 or not g.restarts or lost <= cfg.min_share * a:
        return []
    t0, t1 = extent(ctx)
    if t1 - t0 < cfg.min_duration_s:
        return []
    return [finding(KIND, cfg, "progress", t0, t1, ctx.fresh, {
        "restart_lost_s": r(lost, 1), "share": r(lost / a, 4), "threshold_share": cfg.min_share,
        "restarts": g.restarts, "lost_steps": g.lost_steps, **checkpoint_evidence(ctx)},
        wasted_rank_s=lost * g.ranks)]
