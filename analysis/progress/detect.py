"""Findings from a job's own progress: pure functions over its windows and goodput, with
explicit clocks (``now``) so tests compress time honestly. Thresholds: ``ProgressThresholds``
(docs/progress.md, "Findings")."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .goodput import processes
from .model import Goodput, Window


@dataclass(frozen=True)
class ProgressThresholds:
    hang_min_s: float = 120.0  # no step for at least this long (and ...)
    hang_step_factor: float = 20.0  # ... this many typical step times) with no span open = hung
    span_hang_s: float = 3600.0  # a span open this long is hung too (a 10-minute checkpoint is not)
    fresh_s: float = 90.0  # the newest window must be this recent to call anything ongoing
    regression_ratio: float = 1.25  # recent step time over the baseline
    regression_min_windows: int = 6  # recent windows (10 s each) it must hold for
    slow_rank_ratio: float = 1.15  # a rank's step time over its peers' median
    slow_rank_min_peers: int = 2
    restart_lost_share: float = 0.02  # restart_lost over allocated time
    checkpoint_share: float = 0.10  # checkpoint save + load over allocated time
    startup_share: float = 0.10  # init + compile + checkpoint_load over allocated time
    startup_min_s: float = 60.0


@dataclass
class ProgressFinding:
    kind: str
    scope: str  # "progress" (the job) or "progress:rank<N>"
    severity: str
    start_ts: float
    end_ts: float
    ongoing: bool
    evidence: dict[str, Any] = field(default_factory=dict)


def _r(v: float | None, nd: int = 3) -> float | None:
    return None if v is None else round(float(v), nd)


def _typical_step(ws: Sequence[Window]) -> float | None:
    xs = [w.step_time_p50_s for w in ws if w.step_time_p50_s is not None]
    return statistics.median(xs) if xs else None


def detect_hung(windows: Sequence[Window], now: float, th: ProgressThresholds,
                gpu_busy: bool | None = None) -> ProgressFinding | None:
    """A rank alive but not stepping, no span open (or a span open for hours): the job is hung.
    Judged on each rank's newest window; high confidence (the process itself says so)."""
    by_rank: dict[int, list[Window]] = defaultdict(list)
    for w in windows:
        by_rank[w.rank].append(w)
    stuck: list[dict[str, Any]] = []
    newest = max(w.end for w in windows)
    if now - newest > th.fresh_s:
        return None  # nothing recent: the job (or its agent) stopped reporting; not a verdict
    for rank, ws in by_rank.items():
        last = max(ws, key=lambda w: w.end)
        if not last.alive or last.ended or last.since_step_s is None:
            continue
        typical = _typical_step(ws[-60:]) or 0.0
        limit = max(th.hang_min_s, th.hang_step_factor * typical)
        since = last.since_step_s + max(0.0, now - last.end)
        if last.open_span is None and since > limit:
            stuck.append({"rank": rank, "since_step_s": _r(since, 1), "last_step": _last_step(ws), "host": last.host,
                          "gpu": last.gpu, "typical_step_s": _r(typical, 4), "limit_s": _r(limit, 1)})
        elif last.open_span is not None and (last.open_span_s or 0.0) > th.span_hang_s:
            stuck.append({"rank": rank, "since_step_s": _r(since, 1), "open_span": last.open_span,
                          "open_span_s": _r(last.open_span_s, 1), "host": last.host, "gpu": last.gpu})
    if not stuck:
        return None
    start = now - max(s["since_step_s"] or 0.0 for s in stuck)
    return ProgressFinding("hung", "progress", "critical", start, now, True, {
        "stuck_ranks": [s["rank"] for s in stuck], "ranks": len(by_rank), "detail": stuck[:16],
        "since_step_s": max(s["since_step_s"] or 0.0 for s in stuck),
        "hardware": "busy" if gpu_busy else ("idle" if gpu_busy is False else "not known"),
        "confidence": "high", "judged_from": ["progress"] + (["hardware"] if gpu_busy is not None else [])})


def _last_step(ws: Sequence[Window]) -> int | None:
    for w in sorted(ws, key=lambda w: w.end, reverse=True):
        if w.last_step is not None:
            return w.last_step
    return None


def _series(windows: Sequence[Window]) -> list[tuple[float, float]]:
    """(window start, median over ranks of the window's step-time p50)."""
    by: dict[float, list[float]] = defaultdict(list)
    for w in windows:
        if w.step_time_p50_s is not None and w.steps >= 1:
            by[w.start].append(w.step_time_p50_s)
    return [(t, statistics.median(v)) for t, v in sorted(by.items())]


def detect_regression(windows: Sequence[Window], now: float, th: ProgressThresholds) -> ProgressFinding | None:
    s = _series(windows)
    n = th.regression_min_windows
    if len(s) < 3 * n:
        return None
    base = statistics.median(v for _, v in s[1:max(2, len(s) // 3)])  # skip the first (warm-up) window
    recent = s[-n:]
    if base <= 0 or not all(v > th.regression_ratio * base for _, v in recent):
        return None
    # Where it began: the first window of the trailing run above the threshold.
    k = len(s) - 1
    while k > 0 and s[k - 1][1] > th.regression_ratio * base:
        k -= 1
    rec = statistics.median(v for _, v in recent)
    return ProgressFinding("step_time_regression", "progress", "warning", s[k][0], s[-1][0] + 10.0,
                           now - s[-1][0] < th.fresh_s + 10.0, {
                               "baseline_step_s": _r(base, 4), "recent_step_s": _r(rec, 4),
                               "ratio": _r(rec / base, 3), "since_ts": s[k][0], "windows": len(s) - k,
                               "judged_from": ["progress"]})


def detect_slow_ranks(windows: Sequence[Window], now: float, th: ProgressThresholds,
                      last_s: float = 600.0) -> list[ProgressFinding]:
    """Ranks whose step time (median of their recent windows) is above their peers' median."""
    newest = max(w.end for w in windows)
    by: dict[int, list[Window]] = defaultdict(list)
    for w in windows:
        if w.end >= newest - last_s and w.step_time_p50_s is not None:
            by[w.rank].append(w)
    if len(by) < th.slow_rank_min_peers + 1:
        return []
    med = {r: statistics.median(w.step_time_p50_s for w in ws if w.step_time_p50_s is not None)
           for r, ws in by.items()}
    out = []
    for r, v in sorted(med.items()):
        peers = [x for q, x in med.items() if q != r]
        pm = statistics.median(peers)
        if pm > 0 and v > th.slow_rank_ratio * pm:
            last = max(by[r], key=lambda w: w.end)
            out.append(ProgressFinding("slow_rank", f"progress:rank{r}", "warning", min(w.start for w in by[r]),
                                       last.end, now - newest < th.fresh_s, {
                                           "rank": r, "host": last.host, "node": last.node, "gpu": last.gpu,
                                           "step_s": _r(v, 4), "peers_step_s": _r(pm, 4), "ratio": _r(v / pm, 3),
                                           "n_peers": len(peers), "judged_from": ["progress"]}))
    return out


def young_daly_s(checkpoint_cost_s: float, mtbf_s: float) -> float:
    """Young/Daly's first-order optimum checkpoint interval: sqrt(2 x C x MTBF)."""
    return math.sqrt(2.0 * checkpoint_cost_s * mtbf_s)


def _checkpoint_stats(windows: Sequence[Window]) -> tuple[float, int]:
    total = sum(w.spans.get("checkpoint_save", 0.0) for w in windows)
    n = sum(int(w.span_counts.get("checkpoint_save", 0)) for w in windows)
    return total, n


def detect_overheads(windows: Sequence[Window], g: Goodput, now: float,
                     th: ProgressThresholds) -> list[ProgressFinding]:
    out: list[ProgressFinding] = []
    a = g.allocated_s
    if a <= 0:
        return out
    t0 = min(w.start for w in windows)
    t1 = max(w.end for w in windows)
    ongoing = now - t1 < th.fresh_s
    b = g.badput_s
    save_total, n_saves = _checkpoint_stats([w for w in windows if w.rank == min(x.rank for x in windows)])
    cost = save_total / n_saves if n_saves else None
    interval = g.productive_s / n_saves if n_saves else None
    failures = g.restarts
    mtbf = a / failures if failures else None
    suggested = young_daly_s(cost, mtbf) if (cost and mtbf) else None
    ckpt_ev = {"checkpoint_cost_s": _r(cost, 2), "checkpoints": n_saves, "checkpoint_interval_s": _r(interval, 1),
               "failures": failures, "mtbf_s": _r(mtbf, 1), "young_daly_interval_s": _r(suggested, 1)}
    lost = b.get("restart_lost", 0.0)
    if failures and lost > th.restart_lost_share * a:
        out.append(ProgressFinding("restart_lost_progress", "progress", "warning", t0, t1, ongoing, {
            "restart_lost_s": _r(lost, 1), "share": _r(lost / a, 4), "restarts": failures,
            "lost_steps": g.lost_steps, **ckpt_ev, "judged_from": ["progress"]}))
    ck = b.get("checkpoint_save", 0.0) + b.get("checkpoint_load", 0.0)
    if ck > th.checkpoint_share * a:
        out.append(ProgressFinding("checkpoint_overhead", "progress", "warning", t0, t1, ongoing, {
            "checkpoint_s": _r(ck, 1), "share": _r(ck / a, 4), **ckpt_ev, "judged_from": ["progress"]}))
    st = b.get("init", 0.0) + b.get("compile", 0.0) + b.get("checkpoint_load", 0.0)
    if st > th.startup_share * a and st > th.startup_min_s:
        out.append(ProgressFinding("startup_overhead", "progress", "warning", t0, t1, ongoing, {
            "startup_s": _r(st, 1), "share": _r(st / a, 4), "init_s": _r(b.get("init", 0.0), 1),
            "compile_s": _r(b.get("compile", 0.0), 1), "checkpoint_load_s": _r(b.get("checkpoint_load", 0.0), 1),
            "process_starts": sum(len(processes([w for w in windows if w.rank == r]))
                                  for r in {w.rank for w in windows}), "judged_from": ["progress"]}))
    return out


def detect_all(windows: Sequence[Window], g: Goodput, now: float, th: ProgressThresholds | None = None,
               gpu_busy: bool | None = None) -> list[ProgressFinding]:
    th = th or ProgressThresholds()
    if not windows:
        return []
    out: list[ProgressFinding] = []
    h = detect_hung(windows, now, th, gpu_busy)
    if h is not None:
        out.append(h)
    r = detect_regression(windows, now, th)
    if r is not None:
        out.append(r)
    out.extend(detect_slow_ranks(windows, now, th))
    out.extend(detect_overheads(windows, g, now, th))
    return out


def slow_rank_timeline(windows: Sequence[Window], th: ProgressThresholds | None = None) -> list[dict[str, Any]]:
    """Window by window: the ranks whose step time (the window's p50) is above the peers'
    median by ``slow_rank_ratio`` (when a straggler emerges, and for how long)."""
    th = th or ProgressThresholds()
    by: dict[float, dict[int, float]] = defaultdict(dict)
    for w in windows:
        if w.step_time_p50_s is not None and w.steps >= 3:
            by[w.start][w.rank] = w.step_time_p50_s
    out = []
    for t, per in sorted(by.items()):
        if len(per) < th.slow_rank_min_peers + 1:
            continue
        for r, v in sorted(per.items()):
            pm = statistics.median(x for q, x in per.items() if q != r)
            if pm > 0 and v > th.slow_rank_ratio * pm:
                out.append({"start": t, "rank": r, "step_s": _r(v, 4), "peers_step_s": _r(pm, 4),
                            "ratio": _r(v / pm, 3)})
    return out
