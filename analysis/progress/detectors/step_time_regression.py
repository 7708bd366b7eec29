"""The job's step time rose above its own baseline and stayed there (docs/progress.md).

With the job's hardware rows, the finding also says whether the GPUs slowed down with it: the
mean SM clock of the slow stretch against the baseline's. Clocks that fell (power or thermal
capping, clocks locked lower) point at the hardware; steady clocks clear it and point at the
work itself: the input pipeline, communication, a longer sequence or memory growth."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from ...config import KindConfig
from ..model import Window
from .base import WINDOW_S, ProgressContext, ProgressFinding, finding, r

KIND = "step_time_regression"


CLOCK_FELL = 0.9  # the slow stretch's SM clock under this share of the baseline's: the GPUs slowed


@dataclass(frozen=True, kw_only=True)
class Config(KindConfig):
    SECTION: ClassVar[str] = KIND
    ratio: float  # recent step time over the baseline
    min_windows: int  # recent windows (10 s each) it must hold for


def _clocks(ctx: ProgressContext, base: tuple[float, float], slow: tuple[float, float]) -> dict[str, Any]:
    """The GPUs' SM clock over the baseline and the slow stretch, and what that says."""
    if ctx.clock_at is None:
        return {"sm_clock_baseline_mhz": None, "sm_clock_recent_mhz": None, "gpu_clocks": "not known"}
    b, s = ctx.clock_at(*base), ctx.clock_at(*slow)
    verdict = "not known" if not b or s is None else ("fell" if s < CLOCK_FELL * b else "steady")
    return {"sm_clock_baseline_mhz": r(b, 0), "sm_clock_recent_mhz": r(s, 0), "gpu_clocks": verdict}


def relative_series(windows: Sequence[Window]) -> tuple[list[tuple[float, float]], float | None]:
    """(window start, median over ranks of the rank's step time over its own baseline) and the
    median baseline. A rank's baseline is its median over the run's first third (its first
    window skipped: warm-up); ranks without one (joined later: an elastic resize) are left out.
    Over a fixed rank set each rank against itself, the job-wide figure does not move when fast
    ranks finish first or a slow one leaves: only a change in the ranks' own step times does."""
    pts = [w for w in windows if w.step_time_p50_s is not None and w.steps >= 1]
    if not pts:
        return [], None
    t0 = min(w.start for w in pts)
    t_base = t0 + (max(w.start for w in pts) - t0) / 3.0
    first: dict[int, float] = {}
    for w in pts:
        first[w.rank] = min(first.get(w.rank, w.start), w.start)
    early: dict[int, list[float]] = defaultdict(list)
    for w in pts:
        if w.start <= t_base and w.start > first[w.rank] and w.step_time_p50_s:
            early[w.rank].append(w.step_time_p50_s)
    base = {k: statistics.median(v) for k, v in early.items() if v and statistics.median(v) > 0}
    by: dict[float, list[float]] = defaultdict(list)
    for w in pts:
        b = base.get(w.rank)
        if b is not None and w.step_time_p50_s is not None:
            by[w.start].append(w.step_time_p50_s / b)
    series = [(t, statistics.median(v)) for t, v in sorted(by.items())]
    return series, (statistics.median(base.values()) if base else None)


def detect(ctx: ProgressContext, cfg: Config) -> list[ProgressFinding]:
    s, base_step = relative_series(ctx.windows)
    n = max(cfg.min_windows, int(cfg.min_duration_s // WINDOW_S), 1)
    if len(s) < 3 * n or base_step is None:
        return []
    base = statistics.median(v for _, v in s[1:max(2, len(s) // 3)])  # ~1.0: the ranks against themselves
    recent = s[-n:]
    if base <= 0 or not all(v > cfg.ratio * base for _, v in recent):
        return []
    k = len(s) - 1  # where it began: the first window of the trailing run above the threshold
    while k > 0 and s[k - 1][1] > cfg.ratio * base:
        k -= 1
    rec = statistics.median(v for _, v in recent)
    start, end = s[k][0], s[-1][0] + WINDOW_S
    ranks = len({w.rank for w in ctx.windows})
    hw = _clocks(ctx, (s[1][0], s[max(2, len(s) // 3) - 1][0] + WINDOW_S), (start, end))
    out = finding(KIND, cfg, "progress", start, end, ctx.now - s[-1][0] < ctx.general.fresh_s + WINDOW_S, {
        "baseline_step_s": r(base_step * base, 4), "recent_step_s": r(base_step * rec, 4), "ratio": r(rec / base, 3),
        "threshold_ratio": cfg.ratio, "windows": len(s) - k,  # the slow stretch's start is the flag's start_ts
        **hw}, wasted_rank_s=(end - start) * (1.0 - base / rec) * ranks)
    if hw["gpu_clocks"] != "not known":
        out.evidence["judged_from"] = ["progress", "hardware"]
        out.evidence["cause"] = "gpu_clocks" if hw["gpu_clocks"] == "fell" else "work"
    return [out]
