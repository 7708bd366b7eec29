"""The detector interface: typed job features and typed thresholds in, findings with evidence out.

A detector is one module under ``analysis/detectors/`` holding

- ``KIND``: its flag kind (an entry of ``gpufleet/flagkinds.toml``),
- ``Config``: a frozen ``KindConfig`` dataclass, the kind's section of ``thresholds.toml``,
- ``detect(job: JobView, cfg: Config, found: Found) -> list[Finding]``: a pure function.

``found`` holds the findings of the detectors that ran before (the registry in
``__init__.py`` fixes that order), so a generic diagnosis can step aside for a specific one.
Title, suggestion and default severity come from the registry through ``make_finding``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np

from gpufleet.flagkinds import flag_kinds

from ..config import General, KindConfig, ModelLimits, Thresholds
from ..features import MinuteFeatures
from ..windows import Detection, Windows, detect, episode_mask, masked_median

EventRow = tuple[float, int | None, str, int | None]  # (ts, GPU row or None, kind, code)


@dataclass
class Finding:
    kind: str
    scope: str  # "" = the whole job, else a node name or GPU uuid
    severity: str
    start_ts: float
    end_ts: float
    ongoing: bool
    wasted_gpu_hours: float
    evidence: dict[str, Any]
    suggestion: str
    claim: np.ndarray = field(repr=False, default_factory=lambda: np.zeros((0, 0)))  # (G, K) waste fraction
    windows: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0, dtype=bool))  # (K,) flagged


@dataclass(frozen=True)
class JobContext:
    """What the heuristics know about the job besides its samples."""

    gpu_uuids: list[str]
    gpu_nodes: list[str]
    model: str | None
    limits: ModelLimits
    first_ts: float
    last_ts: float
    workload_class: str | None = None  # training, serving, ... (None: not known)


@dataclass(frozen=True)
class CounterMinutes:
    """Per-GPU, per-minute (G x M) error counters for hw_fault: maxima and minima of cumulative
    counters (a job's own errors are what it added), critical XIDs seen."""

    b0: int  # first minute
    xid_crit: np.ndarray
    remap_max: np.ndarray
    ecc_max: np.ndarray
    ecc_min: np.ndarray
    nvl_err_max: np.ndarray
    nvl_err_min: np.ndarray
    replay_max: np.ndarray
    replay_min: np.ndarray

    @classmethod
    def of(cls, m: MinuteFeatures) -> CounterMinutes:
        f = m.f
        return cls(m.b0, f["xid_crit"], f["remap_max"], f["ecc_max"], f["ecc_min"], f["nvl_err_max"],
                   f["nvl_err_min"], f["replay_max"], f["replay_min"])


@dataclass
class JobView:
    """Everything a detector may read about one job: window features (G x K), the minute
    features they came from, agent events, and the shared idle/active split."""

    w: Windows
    counters: CounterMinutes
    ctx: JobContext
    th: Thresholds
    events: list[EventRow]
    general: General = field(init=False)
    window_s: float = field(init=False)
    valid_k: np.ndarray = field(init=False)  # (K,) windows with any GPU judged
    idle: np.ndarray = field(init=False)  # (G, K)
    active: np.ndarray = field(init=False)  # (G, K) judged and not idle
    n_active: np.ndarray = field(init=False)  # (K,)

    def __post_init__(self) -> None:
        g, f = self.th.general, self.w.f
        self.general = g
        self.window_s = self.w.w_min * 60.0
        self.valid_k = self.w.valid.any(axis=0)
        # NVML utilisation says whether a kernel ran at all: where it is high the GPU is not
        # idle, whatever the profiling counters say (a kernel spinning on one SM is a hang).
        self.idle = self.w.valid & (np.nan_to_num(f.sm, nan=0.0) < g.idle_sm_active) & (
            np.nan_to_num(f.busy_frac, nan=0.0) <= g.idle_busy_frac) & ~(f.gpu_util >= g.idle_gpu_util)
        self.active = self.w.valid & ~self.idle
        self.n_active = self.active.sum(axis=0)

    @property
    def n_gpus(self) -> int:
        return len(self.ctx.gpu_uuids)

    def stats(self, x: np.ndarray, mask_k: np.ndarray, gpus: np.ndarray | None = None) -> float | None:
        """Median over the flagged windows of the per-window GPU median (evidence numbers)."""
        m = (self.active if gpus is None else gpus) & mask_k[None, :]
        vals = masked_median(x, m)
        vals = vals[~np.isnan(vals)]
        return r3(np.median(vals)) if len(vals) else None

    def episodes(self, mask: np.ndarray, cfg: KindConfig) -> Detection | None:
        return detect(mask & self.valid_k, self.valid_k, self.window_s, cfg.min_duration_s, cfg.min_fraction)


@dataclass
class Found:
    """Findings so far, in registry order."""

    findings: list[Finding] = field(default_factory=list)

    def windows(self, *kinds: str) -> np.ndarray | None:
        """Windows flagged by any finding of ``kinds`` (None before any finding exists)."""
        out: np.ndarray | None = None
        for f in self.findings:
            if f.kind in kinds and f.windows.size:
                out = f.windows.copy() if out is None else out | f.windows
        return out

    def explained(self, k: int, *kinds: str) -> np.ndarray:
        m = self.windows(*kinds)
        return m if m is not None else np.zeros(k, dtype=bool)


def r3(x: Any, nd: int = 3) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return None if not np.isfinite(v) else round(v, nd)


def make_finding(job: JobView, kind: str, cfg: KindConfig, det: Detection, claim: np.ndarray,
                 evidence: dict[str, Any], scope: str = "", severity: str | None = None) -> Finding:
    """A finding over ``det``'s episodes: the claim clipped to 0..1 inside them, waste in
    GPU-hours, severity (``severity`` > thresholds override > registry default, raised to
    critical past ``critical_wasted_gpu_hours``), the registry's suggestion for the workload."""
    w = job.w
    spec = flag_kinds().get(kind)
    em = episode_mask(det, w.k)
    claim = np.where(em[None, :] & w.valid, np.clip(np.nan_to_num(claim), 0.0, 1.0), 0.0)
    wasted = float((claim * w.obs_s).sum() / 3600.0)
    start = max(job.ctx.first_ts, w.t0(det.episodes[0].k0))
    end = min(job.ctx.last_ts, w.t1(det.episodes[-1].k1 - 1))
    sev = severity or cfg.severity or spec.severity
    if wasted >= job.general.critical_wasted_gpu_hours:
        sev = "critical"
    longest = max(e.windows for e in det.episodes) * job.window_s
    evidence = {**evidence, "flagged_minutes": round(det.flagged_s / 60, 1),
                "judged_minutes": round(det.judged_s / 60, 1), "episodes": len(det.episodes),
                "longest_episode_minutes": round(longest / 60, 1)}
    return Finding(kind, scope, sev, start, end, det.ongoing, round(wasted, 4), evidence,
                   spec.suggestion_for(job.ctx.workload_class), claim, em)


Cfg = TypeVar("Cfg", bound=KindConfig)


@dataclass(frozen=True)
class DetectorSpec(Generic[Cfg]):
    kind: str
    config: type[Cfg]
    detect: Callable[[JobView, Cfg, Found], list[Finding]]

    def run(self, job: JobView, found: Found) -> list[Finding]:
        return self.detect(job, job.th.get(self.config), found)
