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
from typing import Any, Generic, TypeVar, cast

import numpy as np

from gpufleet.flagkinds import flag_kinds

from ..config import General, KindConfig, ModelLimits, Thresholds
from ..features import MinuteFeatures
from ..windows import Detection, Windows, detect, episode_mask, masked_median, median1d, nz

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


@dataclass(frozen=True)
class MinuteSignals:
    """Per-GPU, per-minute (G x M) means, for patterns that must be timed finer than a window
    (a hang is told from a 10-minute checkpoint by minutes). NaN = not measured."""

    b0: int  # first minute
    n: np.ndarray  # samples per GPU-minute
    sm: np.ndarray
    gpu_util: np.ndarray
    tensor: np.ndarray
    dram: np.ndarray
    power: np.ndarray
    nvl: np.ndarray  # max of tx/rx, bytes/s
    ib: np.ndarray
    # GPU memory in use (the minute's max) and the device's total, bytes: a process that dies
    # gives its memory back, so memory falling to ~0 and rising again is a restart (crash_loop).
    fb: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    fb_total: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    # SM clock while busy, MHz, and the throttle reason bits seen while busy (OR-ed; 0 = none):
    # a straggler's clock deficit and its hardware cause, timed by the minute (straggler).
    clock_busy: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    reasons_or: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))

    @classmethod
    def of(cls, m: MinuteFeatures) -> MinuteSignals:
        f = m.f
        return cls(m.b0, m.n, f["sm"], f["gpu_util"], f["tensor"], f["dram"], f["power"],
                   np.fmax(f["nvl_tx"], f["nvl_rx"]), np.fmax(f["ib_tx"], f["ib_rx"]), f["fb_used_max"], f["fb_total"],
                   f["clock_busy"], f["reasons_or"])


# Signal names (as detectors declare them) -> Coverage's field.
_COVERAGE_OF = {"sm_active": "profiling", "tensor_active": "tensor", "dram_active": "dram", "gpu_util": "gpu_util",
                "power_w": "power", "sm_clock_mhz": "clock", "links": "links", "fb_total_bytes": "fb_total"}


@dataclass(frozen=True)
class Coverage:
    """Which signals each GPU reported (G,) in the judged windows: unknown is not zero, so a
    detector whose signal is missing abstains or falls back, and says so."""

    profiling: np.ndarray  # sm_active (DCGM profiling / GPM)
    tensor: np.ndarray
    dram: np.ndarray
    gpu_util: np.ndarray  # NVML utilisation
    power: np.ndarray
    clock: np.ndarray
    links: np.ndarray  # NVLink or InfiniBand throughput
    fb_total: np.ndarray
    _present: dict[str, dict[str, int]] = field(default_factory=dict, init=False, repr=False, compare=False)

    @classmethod
    def of(cls, w: Windows) -> Coverage:
        f = w.f

        def has(name: str) -> np.ndarray:
            seen = w.seen.get(name)  # build_windows' (one call for all of them)
            return seen if seen is not None else (w.valid & ~np.isnan(getattr(f, name))).any(axis=1)

        # (any over windows of "one of the links measured" = one of the links' any, or-ed)
        links = has("nvl_tx") | has("nvl_rx") | has("ib_tx") | has("ib_rx")
        return cls(has("sm"), has("tensor"), has("dram"), has("gpu_util"), has("power"), has("clock"), links,
                   has("fb_total"))

    def _counts(self) -> dict[str, int]:
        """GPUs reporting each signal (``_COVERAGE_OF``'s names), all counted in one call: the
        report, the detectors' checks and the confidence asked for them one reduction each."""
        got = self._present.get("")
        if got is None:
            names = list(_COVERAGE_OF)
            counts = np.array([getattr(self, _COVERAGE_OF[k]) for k in names]).sum(axis=1).tolist()
            got = self._present[""] = dict(zip(names, counts, strict=True))
        return got

    def has(self, signal: str) -> bool:
        """Any of the job's GPUs reported ``signal`` (the names detectors declare in SIGNALS;
        each detector asks before it runs: answered once per job)."""
        got = self._present.get("")
        return (got if got is not None else self._counts())[signal] > 0

    def as_json(self) -> dict[str, int]:
        c = self._counts()
        return {"n_gpus": len(self.profiling), "sm_active": c["sm_active"], "tensor_active": c["tensor_active"],
                "dram_active": c["dram_active"], "gpu_util": c["gpu_util"], "power_w": c["power_w"],
                "sm_clock_mhz": c["sm_clock_mhz"], "links": c["links"], "fb_total_bytes": c["fb_total_bytes"]}

    def note(self) -> str | None:
        """What the verdicts rest on when profiling metrics are missing (None when all have them)."""
        g = len(self.profiling)
        missing = g - self._counts()["sm_active"]
        if g == 0 or missing == 0:
            return None
        basis = [name for name, signal in (("gpu_util", "gpu_util"), ("power", "power_w")) if self.has(signal)]
        judged = f"judged from {' and '.join(basis)}" if basis else "no activity signal: not judged"
        return f"profiling metrics missing on {missing}/{g} GPUs: {judged}"


@dataclass
class JobView:
    """Everything a detector may read about one job: window features (G x K), error counters,
    agent events, which signals exist, and the shared idle/active split.

    A GPU-window is *judged* when it has enough samples and at least one activity signal
    (``sm_active``, else NVML ``gpu_util``). Where neither was measured nothing is concluded:
    such windows are neither idle nor active."""

    w: Windows
    counters: CounterMinutes
    minutes: MinuteSignals
    ctx: JobContext
    th: Thresholds
    events: list[EventRow]
    fabric: Any = None  # analysis.collectives.features.FabricView: NCCL collectives and NICs (docs/nccl.md)
    general: General = field(init=False)
    window_s: float = field(init=False)
    coverage: Coverage = field(init=False)
    judged: np.ndarray = field(init=False)  # (G, K)
    from_util: np.ndarray = field(init=False)  # (G, K) judged from gpu_util alone (no sm_active)
    activity: np.ndarray = field(init=False)  # (G, K) sm_active, else gpu_util (an upper bound of it)
    valid_k: np.ndarray = field(init=False)  # (K,) windows with any GPU judged
    idle: np.ndarray = field(init=False)  # (G, K)
    active: np.ndarray = field(init=False)  # (G, K) judged and not idle
    n_active: np.ndarray = field(init=False)  # (K,)
    any_active_k: np.ndarray = field(init=False)  # (K,) judged windows with an active GPU (most detectors' mask)
    _medians: dict[int, tuple[np.ndarray, np.ndarray]] = field(init=False, repr=False, default_factory=dict)

    def __post_init__(self) -> None:
        g, f = self.th.general, self.w.f
        self.general = g
        self.window_s = self.w.w_min * 60.0
        self.coverage = Coverage.of(self.w)
        sm_ok = ~np.isnan(f.sm)
        util_ok = ~np.isnan(f.gpu_util)
        self.judged = self.w.valid & (sm_ok | util_ok)
        self.from_util = self.judged & ~sm_ok
        self.activity = np.where(sm_ok, f.sm, f.gpu_util)
        # NVML utilisation says whether a kernel ran at all: where it is high the GPU is not
        # idle, whatever the profiling counters say (a kernel spinning on one SM is a hang).
        # (NaN compares False: where sm_active / gpu_util is NaN, sm_ok / util_ok is False; an
        # unmeasured busy share counts as no busy samples, as 0 would.)
        idle_prof = sm_ok & (f.sm < g.idle_sm_active) & ~(f.busy_frac > g.idle_busy_frac) & ~(
            f.gpu_util >= g.idle_gpu_util)
        idle_util = ~sm_ok & util_ok & (f.gpu_util < g.idle_gpu_util)
        self.idle = self.judged & (idle_prof | idle_util)
        self.active = self.judged & ~self.idle
        self.n_active = self.active.sum(axis=0)
        self.valid_k = cast("np.ndarray", self.judged.any(axis=0))  # judged is 2-D: a (K,) array, never a scalar
        self.any_active_k = self.valid_k & (self.n_active > 0)

    @property
    def n_gpus(self) -> int:
        return len(self.ctx.gpu_uuids)

    def active_medians(self, *xs: np.ndarray) -> list[np.ndarray]:
        """``masked_median(x, self.active)`` (K,) of each (G, K) window feature ``x``: several
        detectors and their evidence ask for the same ones, so each is computed once per job,
        and those asked together in one call (side by side as columns of one (G, n*K) problem:
        a median is per column, so this is each one's arithmetic)."""
        todo: list[np.ndarray] = []
        for x in xs:
            if self._cached_median(x) is None and all(x is not t for t in todo):
                todo.append(x)
        if len(todo) == 1:
            self._medians[id(todo[0])] = (todo[0], masked_median(todo[0], self.active))
        elif todo:
            k = todo[0].shape[1]
            big = masked_median(np.concatenate(todo, axis=1), np.concatenate([self.active] * len(todo), axis=1))
            for i, x in enumerate(todo):
                self._medians[id(x)] = (x, big[i * k:(i + 1) * k])
        return [self._medians[id(x)][1] for x in xs]

    def _cached_median(self, x: np.ndarray) -> np.ndarray | None:
        got = self._medians.get(id(x))
        return got[1] if got is not None and got[0] is x else None  # the array itself is kept: ids stay unique

    def stats(self, x: np.ndarray, mask_k: np.ndarray, gpus: np.ndarray | None = None) -> float | None:
        """Median over the flagged windows of the per-window GPU median (evidence numbers).
        Over the active GPUs: a window's median does not depend on the other windows, so it is
        the active median's value in the flagged windows."""
        vals = self.active_medians(x)[0][mask_k] if gpus is None else masked_median(x, gpus & mask_k[None, :])
        vals = vals[~np.isnan(vals)]
        return r3(median1d(vals)) if len(vals) else None

    def episodes(self, mask: np.ndarray, cfg: KindConfig) -> Detection | None:
        return detect(mask & self.valid_k, self.valid_k, self.window_s, cfg.min_duration_s, cfg.min_fraction)


@dataclass
class Found:
    """Findings so far, in registry order, and the kinds that abstained (kind -> missing signals)."""

    findings: list[Finding] = field(default_factory=list)
    abstained: dict[str, tuple[str, ...]] = field(default_factory=dict)

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
    claim = np.where(em[None, :] & job.judged, np.clip(nz(claim), 0.0, 1.0), 0.0)
    wasted = float((claim * w.obs_s).sum() / 3600.0)
    start = max(job.ctx.first_ts, w.t0(det.episodes[0].k0))
    end = min(job.ctx.last_ts, w.t1(det.episodes[-1].k1 - 1))
    sev = severity or cfg.severity or spec.severity
    if wasted >= job.general.critical_wasted_gpu_hours:
        sev = "critical"
    longest = max(e.windows for e in det.episodes) * job.window_s
    conf, basis = confidence(job, em)
    evidence = {**evidence, "flagged_minutes": round(det.flagged_s / 60, 1),
                "judged_minutes": round(det.judged_s / 60, 1), "episodes": len(det.episodes),
                "longest_episode_minutes": round(longest / 60, 1), "confidence": conf, "judged_from": basis}
    return Finding(kind, scope, sev, start, end, det.ongoing, round(wasted, 4), evidence,
                   spec.suggestion_for(job.ctx.workload_class, evidence.get("cause")), claim, em)


def confidence(job: JobView, em: np.ndarray) -> tuple[str, list[str]]:
    """How much a verdict over windows ``em`` can be trusted, from what it rests on: high when
    the GPUs had profiling metrics, medium when judged from NVML utilisation alone (a duty
    cycle: it tells idle from busy, not how full the SMs were), low when fewer than half of
    the job's GPUs could be judged there."""
    judged = job.judged & em[None, :]
    n = int(judged.sum())
    if n == 0:
        return "low", []
    cov = job.coverage
    from_util = float((job.from_util & judged).sum()) / n
    basis = ["gpu_util"] if from_util > 0.5 else ["sm_active"]
    basis += [name for name in ("gpu_util", "tensor_active", "dram_active", "power_w", "sm_clock_mhz", "links")
              if cov.has(name) and name not in basis]
    gpus_judged = int(judged.any(axis=1).sum())
    if gpus_judged * 2 < job.n_gpus:
        return "low", basis
    return ("medium" if from_util > 0.5 else "high"), basis


@dataclass(frozen=True)
class Signals:
    """What a detector judges from: all of ``needs``, else all of ``fallback`` (empty: no
    fallback); ``corroborate`` only strengthens a verdict. Neither set reported by any GPU of
    the job: the detector abstains (the report says so), it never reads the gap as zero."""

    needs: tuple[str, ...] = ()
    fallback: tuple[str, ...] = ()
    corroborate: tuple[str, ...] = ()

    def missing(self, cov: Coverage) -> tuple[str, ...]:
        """The needed signals nobody reported, when no complete set is there (else ())."""
        lack = [s for s in self.needs if not cov.has(s)]
        if not lack:
            return ()
        if self.fallback and all(cov.has(s) for s in self.fallback):
            return ()
        return tuple(lack)


Cfg = TypeVar("Cfg", bound=KindConfig)


@dataclass(frozen=True)
class DetectorSpec(Generic[Cfg]):
    kind: str
    config: type[Cfg]
    detect: Callable[[JobView, Cfg, Found], list[Finding]]
    signals: Signals = Signals()

    def run(self, job: JobView, found: Found) -> list[Finding]:
        lack = self.signals.missing(job.coverage)
        if lack:
            found.abstained[self.kind] = lack
            return []
        return self.detect(job, job.th.get(self.config), found)
