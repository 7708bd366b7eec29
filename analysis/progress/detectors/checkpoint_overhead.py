"""Saving and loading checkpoints takes a large share of the allocation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ...config import KindConfig
from .base import ProgressContext, ProgressFinding, finding, r
from .checkpoints import checkpoint_evidence, extent

KIND = "checkpoint_overhead"


@dataclass(frozen=True, kw_only=True)
class Config(KindConfig):
    SECTION: ClassVar[str] = KIND
    min_share: float  # checkpoint save + load over the allocated time


def detect(ctx: ProgressContext, cfg: Config) -> list[ProgressFinding]:
    g = ctx.goodput
    a = g.allocated_s
    ck = g.badput_s.get("checkpoint_save", 0.0) + g.badput_s.get("checkpoint_load", 0.0)
    if a <= 0 or ck <= cfg.min_share * a or ck < cfg.min_duration_s:
        return []
    t0, t1 = extent(ctx)
    return [finding(KIND, cfg, "progress", t0, t1, ctx.fresh, {
        "checkpoint_s": r(ck, 1), "share": r(ck / a, 4), "threshold_share": cfg.min_share,
        **checkpoint_evidence(ctx)}, wasted_rank_s=ck * g.ranks)]
