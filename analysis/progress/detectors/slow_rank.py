"""One rank's step time above its peers': the rank, its host, node and GPU named.

Judged window by window against the peers of the same window (a rank's ratio to the median of
the others' step time in that 10 s window, every step of each rank in it folded into its p50),
so the verdict follows what the rank does now and a job-wide change (every rank slower) is no
rank's. Two tiers, each a trailing run of windows (at most ``tolerance`` of them normal, never
two in a row) whose start is the onset (the change point), fixed while the job runs:

- **ratio**: the run is at least ``ratio`` (1.15) above the peers for ``recent_s`` (a minute):
  a fail-slow GPU, a 3.5x late slowdown, a transient straggler. When the run began after the
  rank had a baseline (``min_baseline_s`` of windows in the ``baseline_s`` before it), it must
  also be ``change`` above the rank's own standing then, so a rank that always runs ~10% above
  its peers (a different host or data shard: the "stable variation" of Alibaba's PAI job 2) is
  not flagged when noise lifts it over the bar for a minute; a rank 15% slower from its first
  window is flagged (it sets the pace of every synchronous step).
- **change**: a modest but sustained slowdown: the run is ``modest_ratio`` (1.05) above the
  peers for ``modest_s`` and ``change`` above the rank's own standing before it (PAI job 3's
  workers that rise 20-25% over their own history while their peers do not, ending 10-17%
  above the peers' median that they themselves pull up). A rank whose standing never changed
  is not flagged at this tier, however long it runs 5-15% slow: that is the job's stable
  variation, shown by rank in the slow-rank timeline and the per-rank goodput, not a fault.

The evidence gives its new step time beside its own earlier one; a straggler that recovers
ends its run and its flag."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

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
    tolerance: float = 0.25  # ... and inside it at most this share of the rank's steps may read normal ...
    gap_steps: int = 20  # ... and no normal stretch longer than one window holds more steps than this
    lookback_s: float = 21600.0  # windows judged: the newest 6 hours (the onset of an older run is kept as its start)
    change: float = 0.07  # a run that began mid-history: this far above the rank's own standing before it
    baseline_s: float = 3600.0  # that standing: the rank's median ratio over this long before the run ...
    min_baseline_s: float = 120.0  # ... from this much of windows at least ...
    min_baseline_steps: int = 100  # ... and this many of its steps (less: no baseline)
    lost_steps: float = 20.0  # either tier: the run cost the job this many of the peers' steps at least
    modest_ratio: float = 1.05  # the change tier: a run this far above the peers ...
    modest_s: float = 180.0  # ... lasting this long, and ``change`` above the rank's standing before it


class Point(NamedTuple):
    t: float  # the window's start
    v: float  # the rank's step time p50 in it
    pm: float  # the median of the other ranks' p50 in the same window
    steps: int  # the rank's steps in it


def _ratios(windows: Sequence[Window], since: float) -> dict[int, list[Point]]:
    """Per rank, window by window: its step time against its peers' in the same window."""
    by: dict[float, dict[int, tuple[float, int]]] = defaultdict(dict)
    for w in windows:
        if w.start >= since and w.step_time_p50_s is not None and w.steps >= 1:
            by[w.start][w.rank] = (w.step_time_p50_s, w.steps)
    out: dict[int, list[Point]] = defaultdict(list)
    for t, per in sorted(by.items()):
        if len(per) < 2:
            continue
        vals = sorted(v for v, _ in per.values())
        n = len(vals)
        for rank, (v, steps) in per.items():
            others = vals.copy()
            others.remove(v)
            pm = others[(n - 1) // 2] if (n - 1) % 2 else (others[(n - 1) // 2 - 1] + others[(n - 1) // 2]) / 2
            out[rank].append(Point(t, v, pm, steps))
    return out


def _trailing_run(series: Sequence[Point], ratio: float, tolerance: float, gap_steps: int) -> int | None:
    """Index where the newest run of slow windows starts (windows above ``ratio`` x peers), None
    when the newest window is not slow: the earliest slow window from which at most
    ``tolerance`` of the steps read normal, with no normal stretch of more than one window
    that holds over ``gap_steps`` steps inside. Counted in the rank's steps, so the rule
    reads alike whatever its step time (one slow 6 s step spans a window or two)."""
    slow = [p.pm > 0 and p.v > ratio * p.pm for p in series]
    if not slow or not slow[-1]:
        return None
    k = len(slow) - 1
    best, total, normal, gap_w, gap_n = k, series[k].steps, 0, 0, 0
    while k > 0:
        k -= 1
        n = series[k].steps
        if slow[k]:
            gap_w = gap_n = 0
            total += n
            if normal <= tolerance * total:
                best = k
            continue
        gap_w += 1
        gap_n += n
        normal += n
        total += n
        if gap_w > 1 and gap_n > gap_steps:
            break
    return best


class _Run(NamedTuple):
    k: int  # index of the run's first window in the rank's series
    ratio: float  # the run's median ratio to the peers
    before: float | None  # the rank's median ratio in the baseline before the run (None: no baseline)
    tier: str  # "ratio" (>= ratio x peers) or "change" (a modest, sustained rise against its own standing)


def _median_ratio(series: Sequence[Point]) -> float | None:
    xs = [p.v / p.pm for p in series if p.pm > 0]
    return statistics.median(xs) if xs else None


def _lost(run: Sequence[Point], ref: float) -> float:
    """The run's cost to the job in the peers' steps: each of the rank's steps took ``ratio -
    ref`` of a peer's step more (``ref``: 1, or the rank's usual standing when it was above)."""
    return sum(p.steps * (p.v / p.pm - ref) for p in run if p.pm > 0)


def _judge(series: list[Point], cfg: Config) -> _Run | None:
    """The rank's verdict from its windows' ratios to their peers (module docstring)."""
    for bar, need_s, tier in ((cfg.ratio, cfg.recent_s, "ratio"), (cfg.modest_ratio, cfg.modest_s, "change")):
        k = _trailing_run(series, bar, cfg.tolerance, cfg.gap_steps)
        if k is None:
            continue
        start, end = series[k].t, series[-1].t + WINDOW_S
        if end - start < max(need_s, cfg.min_duration_s):
            continue
        now = _median_ratio(series[k:])
        base = [p for p in series[:k] if p.t >= start - cfg.baseline_s]
        enough = len(base) * WINDOW_S >= cfg.min_baseline_s and sum(p.steps for p in base) >= cfg.min_baseline_steps
        before = _median_ratio(base) if enough else None
        if now is None or now < bar or _lost(series[k:], max(1.0, before or 1.0)) < cfg.lost_steps:
            continue
        if tier == "ratio" and (before is None or before >= bar or now >= before * (1.0 + cfg.change)):
            return _Run(k, now, before, tier)
        if tier == "change" and before is not None and now >= before * (1.0 + cfg.change):
            return _Run(k, now, before, tier)
    return None


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
        if series[-1].t + WINDOW_S < newest - STALE_S:
            continue  # no longer reporting with the others
        run = _judge(series, cfg)
        if run is None:
            continue
        slow = series[run.k:]
        start, end = slow[0].t, slow[-1].t + WINDOW_S
        v = statistics.median(p.v for p in slow)
        pm = statistics.median(p.pm for p in slow)
        before = [p.v for p in series[:run.k]]
        own = statistics.median(before) if before else None
        last = last_of[rank]
        out.append(finding(KIND, cfg, f"progress:rank{rank}", start, end, ctx.fresh, {
            "rank": rank, "host": last.host, "node": last.node, "gpu": last.gpu, "step_s": r(v, 4),
            "peers_step_s": r(pm, 4), "ratio": r(v / pm, 3),
            "threshold_ratio": cfg.ratio if run.tier == "ratio" else cfg.modest_ratio,
            "n_peers": len(ranks) - 1, "own_baseline_step_s": r(own, 4),
            "own_ratio": r(v / own, 3) if own else None, "slow_windows": len(slow)},
            wasted_rank_s=(end - start) * max(0.0, 1.0 - pm / v) * (len(ranks) - 1)))
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
