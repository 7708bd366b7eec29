"""throttled: busy SM clocks held well below the model's maximum, with a power/thermal reason set.

The clock-event reasons seen while throttled name the cause (thermal, the software power cap,
the hardware power brake, or a bare hardware slowdown), and the registry's suggestion for that
cause is the one given: a hot rack is not told to raise its power limit."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..config import KindConfig
from ..windows import episode_mask, nz, nz_ge, nz_lt, share
from .base import Finding, Found, JobView, Signals, make_finding
from .straggler import Config as StragglerConfig

KIND = "throttled"
SIGNALS = Signals(needs=("sm_clock_mhz",), corroborate=("power_w",))

# NVML's clock-event reason bits (nvmlClocksEventReasons) and NVIDIA's names for them.
REASONS = {0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x20: "sw_thermal", 0x40: "hw_thermal", 0x80: "hw_power_brake"}
# Cause -> the bits that show it, in precedence order for ties. HW slowdown is what the board
# asserts for a thermal or power-brake event, so it names its own cause only when neither is set.
CAUSES: tuple[tuple[str, int], ...] = (("power_brake", 0x80), ("thermal", 0x40 | 0x20), ("power_cap", 0x4),
                                      ("hw_slowdown", 0x8))


def measured_cause(bits: np.ndarray) -> tuple[str | None, list[str]]:
    """From the reason bits of the throttled GPU-windows: the cause set in the most of them
    (None when no reason was recorded) and the reasons seen, most frequent first."""
    b = bits.astype(np.int64)
    counts = {name: int(((b & bit) != 0).sum()) for bit, name in REASONS.items()}
    seen = sorted((n for n, c in counts.items() if c), key=lambda n: -counts[n])
    named = {cause: int(((b & bit) != 0).sum()) for cause, bit in CAUSES}
    named["hw_slowdown"] = int((((b & 0x8) != 0) & ((b & 0xE0) == 0)).sum())
    best = max(CAUSES, key=lambda c: named[c[0]])[0]  # max keeps the first of equals: precedence
    return (best if named[best] else None), seen


@dataclass(frozen=True, kw_only=True)
class Config(KindConfig):
    SECTION: ClassVar[str] = KIND
    clock_ratio_max: float  # busy SM clock below this share of the model's max clock
    throttle_frac_min: float  # share of busy samples with a throttle reason set
    reasons_mask: int  # clock_event_reasons bits that count (power and thermal)
    gpu_share_min: float  # job-wide; one slow GPU or node among peers is a straggler


def detect(job: JobView, cfg: Config, found: Found) -> list[Finding]:
    f, lim = job.w.f, job.ctx.limits
    ratio = f.clock_busy / lim.max_sm_clock_mhz
    per_gpu = job.active & nz_lt(ratio, cfg.clock_ratio_max, nan=1.0) & nz_ge(f.throttle_frac, cfg.throttle_frac_min)
    if cfg.gpu_share_min > 0 and not per_gpu.any():
        return []  # no GPU-window qualifies: no share reaches a positive minimum, no episode (sh > 0 neither)
    min_peers = job.th.get(StragglerConfig).min_gpus
    sh = share(per_gpu, job.active)
    # Few GPUs: no peers to compare, any throttled GPU is the job's problem.
    job_wide = np.where(job.n_active < min_peers, sh > 0, sh >= cfg.gpu_share_min)
    det = job.episodes(job.any_active_k & job_wide, cfg)
    if not det:
        return []
    em = episode_mask(det, job.w.k)
    claim = np.where(per_gpu, 1.0 - np.minimum(1.0, nz(ratio, nan=1.0)), 0.0)
    cause, seen = measured_cause(f.throttle_reasons[per_gpu & em[None, :]])
    return [make_finding(job, KIND, cfg, det, claim, {
        "sm_clock_mhz": job.stats(f.clock_busy, em, per_gpu), "max_sm_clock_mhz": lim.max_sm_clock_mhz,
        "throttle_fraction": job.stats(f.throttle_frac, em, per_gpu),
        "throttled_gpus": int((per_gpu & em[None, :]).any(axis=1).sum()),
        "threshold_clock_ratio": cfg.clock_ratio_max, "throttle_reasons": seen,
        **({"cause": cause} if cause else {})})]
