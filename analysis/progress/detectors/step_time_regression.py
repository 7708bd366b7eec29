"""The job's step time rose above its own baseline and stayed there (docs/progress.md)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import ClassVar

from ...config import KindConfig
from .base import WINDOW_S, ProgressContext, ProgressFinding, finding, r, series

KIND = "step_time_regression"


@dataclass(frozen=True, kw_only=True)
class Config(KindConfig):
    SECTION: ClassVar[str] = KIND
    ratio: float  # recent step time over the baseline
    min_windows: int  # recent windows (10 s each) it must hold for


def detect(ctx: ProgressContext, cfg: Config) -> list[ProgressFinding]:
    s = series(ctx.windows)
    n = max(cfg.min_windows, int(cfg.min_duration_s // WINDOW_S), 1)
    if len(s) < 3 * n:
        return []
    base = statistics.median(v for _, v in s[1:max(2, len(s) // 3)])  # skip the first (warm-up) window
    recent = s[-n:]
    if base <= 0 or not all(v > cfg.ratio * base for _, v in recent):
        return []
    k = len(s) - 1  # where it began: the first window of the trailing run above the threshold
    while k > 0 and s[k - 1][1] > cfg.ratio * base:
        k -= 1
    rec = statistics.median(v for _, v in recent)
    start, end = s[k][0], s[-1][0] + WINDOW_S
    ranks = len({w.rank for w in ctx.windows})
    return [finding(KIND, cfg, "progress", start, end, ctx.now - s[-1][0] < ctx.general.fresh_s + WINDOW_S, {
        "baseline_step_s": r(base, 4), "recent_step_s": r(rec, 4), "ratio": r(rec / base, 3),
        "threshold_ratio": cfg.ratio, "windows": len(s) - k},  # the slow stretch's start is the flag's start_ts
        wasted_rank_s=(end - start) * (1.0 - base / rec) * ranks)]
