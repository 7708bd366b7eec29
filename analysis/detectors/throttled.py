"""throttled: busy SM clocks held well below the model's maximum, with a power/thermal reason set."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..config import KindConfig
from ..windows import episode_mask, share
from .base import Finding, Found, JobView, Signals, make_finding
from .straggler import Config as StragglerConfig

KIND = "throttled"
SIGNALS = Signals(needs=("sm_clock_mhz",), corroborate=("power_w",))


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
    per_gpu = job.active & (np.nan_to_num(ratio, nan=1.0) < cfg.clock_ratio_max) & (
        np.nan_to_num(f.throttle_frac) >= cfg.throttle_frac_min)
    min_peers = job.th.get(StragglerConfig).min_gpus
    sh = share(per_gpu, job.active)
    # Few GPUs: no peers to compare, any throttled GPU is the job's problem.
    job_wide = np.where(job.n_active < min_peers, sh > 0, sh >= cfg.gpu_share_min)
    det = job.episodes(job.valid_k & (job.n_active > 0) & job_wide, cfg)
    if not det:
        return []
    em = episode_mask(det, job.w.k)
    claim = np.where(per_gpu, 1.0 - np.minimum(1.0, np.nan_to_num(ratio, nan=1.0)), 0.0)
    return [make_finding(job, KIND, cfg, det, claim, {
        "sm_clock_mhz": job.stats(f.clock_busy, em, per_gpu), "max_sm_clock_mhz": lim.max_sm_clock_mhz,
        "throttle_fraction": job.stats(f.throttle_frac, em, per_gpu),
        "throttled_gpus": int((per_gpu & em[None, :]).any(axis=1).sum()),
        "threshold_clock_ratio": cfg.clock_ratio_max})]
