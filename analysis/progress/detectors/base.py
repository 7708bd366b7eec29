"""The progress detector interface: a job's progress windows and goodput in, findings out.

A progress detector is one module here (its kind's registry entry says ``source =
"progress"``) holding ``KIND``, a frozen ``Config(KindConfig)`` (its section of
``analysis/thresholds.toml``) and a pure ``detect(ctx: ProgressContext, cfg: Config) ->
list[ProgressFinding]``. Explicit clocks (``ctx.now``) so tests compress time honestly; default
severity from the registry unless the section overrides it."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from gpufleet.flagkinds import flag_kinds

from ...config import KindConfig, ProgressGeneral
from ..model import Goodput, Window

WINDOW_S = 10.0  # the relay's window (gpufleet/progress_fold.py)

# The job's GPUs' mean SM clock (MHz) over [a, b] from the hardware rollups, None where no
# minute is known. Lets a progress finding say whether the GPUs themselves slowed down.
ClockAt = Callable[[float, float], "float | None"]


@dataclass
class ProgressFinding:
    kind: str
    scope: str  # "progress" (the job) or "progress:rank<N>"
    severity: str
    start_ts: float
    end_ts: float
    ongoing: bool
    evidence: dict[str, Any] = field(default_factory=dict)
    wasted_rank_s: float = 0.0  # rank-seconds lost (one GPU per rank); flags.py caps it by the allocation


@dataclass(frozen=True)
class ProgressContext:
    windows: Sequence[Window]
    goodput: Goodput
    now: float
    general: ProgressGeneral
    clock_at: ClockAt | None = None  # None: no hardware rows for the job (progress alone)

    @property
    def newest(self) -> float:
        return max(w.end for w in self.windows)

    @property
    def fresh(self) -> bool:
        return self.now - self.newest < self.general.fresh_s


def finding(kind: str, cfg: KindConfig, scope: str, start: float, end: float, ongoing: bool,
            evidence: dict[str, Any], wasted_rank_s: float = 0.0) -> ProgressFinding:
    sev = cfg.severity or flag_kinds().get(kind).severity
    return ProgressFinding(kind, scope, sev, start, end, ongoing,
                           {**evidence, "confidence": "high", "judged_from": ["progress"]}, max(0.0, wasted_rank_s))


def r(v: float | None, nd: int = 3) -> float | None:
    return None if v is None else round(float(v), nd)


def series(windows: Sequence[Window]) -> list[tuple[float, float]]:
    """(window start, median over ranks of the window's step-time p50)."""
    by: dict[float, list[float]] = defaultdict(list)
    for w in windows:
        if w.step_time_p50_s is not None and w.steps >= 1:
            by[w.start].append(w.step_time_p50_s)
    return [(t, statistics.median(v)) for t, v in sorted(by.items())]


C = TypeVar("C", bound=KindConfig)


@dataclass(frozen=True)
class ProgressDetectorSpec(Generic[C]):
    kind: str
    config: type[C]
    detect: Callable[[ProgressContext, C], list[ProgressFinding]]
