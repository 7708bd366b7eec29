"""One rank's step time above its peers' median: the rank, its host, node and GPU named."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from ...config import KindConfig
from ..model import Window
from .base import ProgressContext, ProgressFinding, finding, r

KIND = "slow_rank"


@dataclass(frozen=True, kw_only=True)
class Config(KindConfig):
    SECTION: ClassVar[str] = KIND
    ratio: float  # a rank's step time over its peers' median
    min_peers: int
    recent_s: float  # judged over the newest windows of this span


def detect(ctx: ProgressContext, cfg: Config) -> list[ProgressFinding]:
    newest = ctx.newest
    by: dict[int, list[Window]] = defaultdict(list)
    for w in ctx.windows:
        if w.end >= newest - cfg.recent_s and w.step_time_p50_s is not None:
            by[w.rank].append(w)
    if len(by) < cfg.min_peers + 1:
        return []
    med = {k: statistics.median(w.step_time_p50_s for w in ws if w.step_time_p50_s is not None)
           for k, ws in by.items()}
    out = []
    for rank, v in sorted(med.items()):
        peers = [x for q, x in med.items() if q != rank]
        pm = statistics.median(peers)
        if pm > 0 and v > cfg.ratio * pm:
            last = max(by[rank], key=lambda w: w.end)
            start = min(w.start for w in by[rank])
            if last.end - start < cfg.min_duration_s:
                continue
            out.append(finding(KIND, cfg, f"progress:rank{rank}", start, last.end, ctx.fresh, {
                "rank": rank, "host": last.host, "node": last.node, "gpu": last.gpu, "step_s": r(v, 4),
                "peers_step_s": r(pm, 4), "ratio": r(v / pm, 3), "threshold_ratio": cfg.ratio,
                "n_peers": len(peers)}, wasted_rank_s=(last.end - start) * (1.0 - pm / v) * len(peers)))
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
