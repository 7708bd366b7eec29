"""Findings from a job's own progress: pure functions over its windows and goodput, with
explicit clocks (``now``) so tests compress time honestly. ``hung`` is judged here (a hardware
kind: the progress is its second kind of evidence); the kinds whose registry entry says
``source = "progress"`` are the modules of ``detectors/``. Thresholds: ``[progress]`` and each
kind's section of ``analysis/thresholds.toml`` (docs/progress.md, "Findings and flags")."""

from __future__ import annotations

import dataclasses
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from ..config import KindConfig, ProgressGeneral, Thresholds, load_thresholds
from .detectors import PROGRESS_DETECTORS, ClockAt, ProgressContext, ProgressFinding
from .detectors import slow_rank as _slow_rank
from .detectors.checkpoints import young_daly_s
from .model import Goodput, Window

C = TypeVar("C", bound=KindConfig)

__all__ = ["ProgressFinding", "ProgressThresholds", "detect_all", "detect_hung", "slow_rank_timeline",
           "young_daly_s"]


@dataclass(frozen=True)
class ProgressThresholds:
    """The typed progress sections of the thresholds: ``general`` ([progress]) and each
    progress kind's ``Config``. ``load(hang_min_s=10.0)`` overrides [progress] keys (tests
    scale time this way)."""

    general: ProgressGeneral
    configs: tuple[KindConfig, ...]

    @classmethod
    def load(cls, th: Thresholds | None = None, **general: float) -> ProgressThresholds:
        th = th or load_thresholds()
        return cls(dataclasses.replace(th.progress, **general), tuple(th.get(d.config) for d in PROGRESS_DETECTORS))

    def get(self, cls: type[C]) -> C:
        for c in self.configs:
            if type(c) is cls:
                return c
        raise KeyError(f"no thresholds section {cls.SECTION!r}")

    def replace(self, cls: type[C], **kw: Any) -> ProgressThresholds:
        """The same thresholds with keys of one kind's section changed."""
        return ProgressThresholds(self.general, tuple(dataclasses.replace(c, **kw) if type(c) is cls else c
                                                      for c in self.configs))


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
    if now - newest > th.general.fresh_s:
        return None  # nothing recent: the job (or its agent) stopped reporting; not a verdict
    for rank, ws in by_rank.items():
        last = max(ws, key=lambda w: w.end)
        if not last.alive or last.ended or last.since_step_s is None:
            continue
        typical = _typical_step(ws[-60:]) or 0.0
        limit = max(th.general.hang_min_s, th.general.hang_step_factor * typical)
        since = last.since_step_s + max(0.0, now - last.end)
        if last.open_span is None and since > limit:
            stuck.append({"rank": rank, "since_step_s": _r(since, 1), "last_step": _last_step(ws), "host": last.host,
                          "gpu": last.gpu, "typical_step_s": _r(typical, 4), "limit_s": _r(limit, 1)})
        elif last.open_span is not None and (last.open_span_s or 0.0) > th.general.span_hang_s:
            stuck.append({"rank": rank, "since_step_s": _r(since, 1), "open_span": last.open_span,
                          "open_span_s": _r(last.open_span_s, 1), "host": last.host, "gpu": last.gpu})
    if not stuck:
        return None
    start = now - max(s["since_step_s"] or 0.0 for s in stuck)
    ev = {"stuck_ranks": [s["rank"] for s in stuck], "ranks": len(by_rank), "detail": stuck[:16],
          "since_step_s": max(s["since_step_s"] or 0.0 for s in stuck),
          "hardware": "busy" if gpu_busy else ("idle" if gpu_busy is False else "not known"),
          "confidence": "high", "judged_from": ["progress"] + (["hardware"] if gpu_busy is not None else [])}
    # a hang wastes all of the ranks' time from its start
    return ProgressFinding("hung", "progress", "critical", start, now, True, ev, (now - start) * len(by_rank))


def _last_step(ws: Sequence[Window]) -> int | None:
    for w in sorted(ws, key=lambda w: w.end, reverse=True):
        if w.last_step is not None:
            return w.last_step
    return None


def detect_all(windows: Sequence[Window], g: Goodput, now: float, th: ProgressThresholds | None = None,
               gpu_busy: bool | None = None, clock_at: ClockAt | None = None) -> list[ProgressFinding]:
    """``hung`` from progress, then every progress kind's detector in ``PROGRESS_DETECTORS`` order."""
    th = th or ProgressThresholds.load()
    if not windows:
        return []
    out: list[ProgressFinding] = []
    h = detect_hung(windows, now, th, gpu_busy)
    if h is not None:
        out.append(h)
    ctx = ProgressContext(windows, g, now, th.general, clock_at)
    for d in PROGRESS_DETECTORS:
        out.extend(d.detect(ctx, th.get(d.config)))
    return out


def slow_rank_timeline(windows: Sequence[Window], th: ProgressThresholds | None = None) -> list[dict[str, Any]]:
    """Window by window: the ranks above their peers' median step time (``slow_rank``'s ratio)."""
    th = th or ProgressThresholds.load()
    return _slow_rank.timeline(windows, th.get(_slow_rank.Config))
