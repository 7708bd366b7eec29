"""One rank's step time above its peers' median: the rank, its host, node and GPU named.

Judged window by window against the peers of the same window (a rank's ratio to the median of
the others' step time then), so the verdict follows what the rank does now: a rank that slows
3.5x late in a long run is singled out within a minute of windows, whatever its earlier
windows were, and the evidence gives its new step time beside its own earlier one. The flag
starts at the onset: the first window of the trailing run of slow windows (the change point),
which stays put while the job runs; a straggler that recovers ends its run and its flag."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from ...config import KindConfig
from ..model import Window
from .base import WINDOW_S, ProgressContext, ProgressFinding, finding, r

KIND = "slow_rank"
STALE_S = 60.0  # a rank whose newest judged window is older than this behind the job's is not judged now


@dataclass(frozen=True, kw_only=True)
class Config(KindConfig):
    SECTION: ClassVar[str] = KIND
    ratio: float  # a rank's step time over its peers' median
    min_peers: int
    recent_s: float  # the trailing slow run must last this long (a minute of 10 s windows) ...
    tolerance: float = 0.25  # ... and inside it at most this share of the rank's windows may read normal
    lookback_s: float = 21600.0  # windows judged: the newest 6 hours (the onset of an older run is kept as its start)


def _ratios(windows: Sequence[Window], since: float) -> dict[int, list[tuple[float, float, float]]]:
    """Per rank: (window start, its step time p50, the median of the other ranks' p50 then)."""
    by: dict[float, dict[int, float]] = defaultdict(dict)
    for w in windows:
        if w.start >= since and w.step_time_p50_s is not None and w.steps >= 1:
            by[w.start][w.rank] = w.step_time_p50_s
    out: dict[int, list[tuple[float, float, float]]] = defaultdict(list)
    for t, per in sorted(by.items()):
        if len(per) < 2:
            continue
        vals = sorted(per.values())
        n = len(vals)
        for rank, v in per.items():
            others = vals.copy()
            others.remove(v)
            pm = others[(n - 1) // 2] if (n - 1) % 2 else (others[(n - 1) // 2 - 1] + others[(n - 1) // 2]) / 2
            out[rank].append((t, v, pm))
    return out


def _trailing_run(series: list[tuple[float, float, float]], ratio: float, tolerance: float) -> int | None:
    """Index where the newest run of slow windows starts (windows above ``ratio`` x peers, at
    most ``tolerance`` of them normal and never two normal in a row), None when the newest
    window is not slow."""
    slow = [pm > 0 and v > ratio * pm for _, v, pm in series]
    if not slow or not slow[-1]:
        return None
    k, normal, gap = len(slow) - 1, 0, 0
    best = k
    while k > 0:
        k -= 1
        if slow[k]:
            gap = 0
            best = k
            continue
        normal += 1
        gap += 1
        if gap > 1 or normal > tolerance * (len(slow) - k):
            break
    return best


def detect(ctx: ProgressContext, cfg: Config) -> list[ProgressFinding]:
    newest = ctx.newest
    ranks = {w.rank for w in ctx.windows}
    if len(ranks) < cfg.min_peers + 1:
        return []
    per = _ratios(ctx.windows, newest - cfg.lookback_s)
    last_of: dict[int, Window] = {}
    for w in ctx.windows:
        if w.rank not in last_of or w.end > last_of[w.rank].end:
            last_of[w.rank] = w
    out = []
    for rank in sorted(per):
        series = per[rank]
        k = _trailing_run(series, cfg.ratio, cfg.tolerance)
        if k is None or series[-1][0] + WINDOW_S < newest - STALE_S:
            continue  # not slow in its newest window, or no longer reporting with the others
        run = series[k:]
        start, end = run[0][0], run[-1][0] + WINDOW_S
        if end - start < max(cfg.recent_s, cfg.min_duration_s):
            continue
        v = statistics.median(x for _, x, _ in run)
        pm = statistics.median(p for _, _, p in run)
        if pm <= 0 or v <= cfg.ratio * pm:
            continue
        before = [x for _, x, _ in series[:k]]
        own = statistics.median(before) if before else None
        last = last_of[rank]
        out.append(finding(KIND, cfg, f"progress:rank{rank}", start, end, ctx.fresh, {
            "rank": rank, "host": last.host, "node": last.node, "gpu": last.gpu, "step_s": r(v, 4),
            "peers_step_s": r(pm, 4), "ratio": r(v / pm, 3), "threshold_ratio": cfg.ratio,
            "n_peers": len(ranks) - 1, "own_baseline_step_s": r(own, 4),
            "own_ratio": r(v / own, 3) if own else None, "slow_windows": len(run)},
            wasted_rank_s=(end - start) * (1.0 - pm / v) * (len(ranks) - 1)))
    return out


def timeline(windows: Sequence[Window], cfg: Config) -> list[dict[str, Any]]:
    """Window by window: the ranks whose step time (the window's p50) is above the peers'
    median by ``ratio`` (when a straggler emerges, and for how long)."""
    by: dict[float, dict[int, float]] = defaultdict(dict)
    for w in windows:
        if w.step_time_p50_s is not None and w.steps >= 3:
            by[w.start][w.rank] = w.step_time_p50_s
    out = []
    for t, per in sorted(by.items()):
        if len(per) < cfg.min_peers + 1:
            continue
        for rank, v in sorted(per.items()):
            pm = statistics.median(x for q, x in per.items() if q != rank)
            if pm > 0 and v > cfg.ratio * pm:
                out.append({"start": t, "rank": rank, "step_s": r(v, 4), "peers_step_s": r(pm, 4),
                            "ratio": r(v / pm, 3)})
    return out
