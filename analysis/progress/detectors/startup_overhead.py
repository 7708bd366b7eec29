"""Initialisation, compilation and checkpoint loading take a large share of the allocation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ...config import KindConfig
from ..goodput import processes
from .base import ProgressContext, ProgressFinding, finding, r
from .checkpoints import extent

KIND = "startup_overhead"


@dataclass(frozen=True, kw_only=True)
class Config(KindConfig):
    SECTION: ClassVar[str] = KIND
    min_share: float  # init + compile + checkpoint_load over the allocated time (and over min_duration_s)


def detect(ctx: ProgressContext, cfg: Config) -> list[ProgressFinding]:
    g = ctx.goodput
    a, b = g.allocated_s, g.badput_s
    st = b.get("init", 0.0) + b.get("compile", 0.0) + b.get("checkpoint_load", 0.0)
    if a <= 0 or st <= cfg.min_share * a or st <= cfg.min_duration_s:
        return []
    t0, t1 = extent(ctx)
    starts = sum(len(processes([w for w in ctx.windows if w.rank == k])) for k in {w.rank for w in ctx.windows})
    return [finding(KIND, cfg, "progress", t0, t1, ctx.fresh, {
        "startup_s": r(st, 1), "share": r(st / a, 4), "threshold_share": cfg.min_share,
        "init_s": r(b.get("init", 0.0), 1), "compile_s": r(b.get("compile", 0.0), 1),
        "checkpoint_load_s": r(b.get("checkpoint_load", 0.0), 1), "process_starts": starts},
        wasted_rank_s=st * g.ranks)]
