"""no_tensor_cores: busy, compute-bound SMs with no tensor-core math (matmuls in plain FP32).

Only compute-bound work can gain from tensor cores: memory-bound kernels (DRAM near its
bandwidth) and FP64 codes (any FP64 pipe use: tensor cores do not help sparse or
double-precision solvers) are exempt. Tensor activity not measured: no verdict."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..config import KindConfig
from ..windows import episode_mask, nz
from .base import Finding, Found, JobView, Signals, make_finding

KIND = "no_tensor_cores"
SIGNALS = Signals(needs=("sm_active", "tensor_active"), corroborate=("dram_active",))


@dataclass(frozen=True, kw_only=True)
class Config(KindConfig):
    SECTION: ClassVar[str] = KIND
    tensor_active_max: float
    sm_active_min: float
    fp64_active_max: float  # FP64 pipes busier than this: a double-precision code, exempt
    dram_active_max: float  # DRAM busier than this: memory-bound, tensor cores would not help
    waste_fraction: float


def detect(job: JobView, cfg: Config, found: Found) -> list[Finding]:
    if job.ctx.workload_class == "hpc":
        return []  # simulation codes (MD, CFD, lattice) mostly have no tensor-core path to enable
    f = job.w.f
    # A median below (at or above) a threshold needs one of its values below (at or above) it:
    # where no active GPU-window has little tensor use, or none is busy enough, no window can
    # qualify, and the medians are not needed.
    if not (job.active & (f.tensor < cfg.tensor_active_max)).any() or not (
            job.active & (f.sm >= cfg.sm_active_min)).any():
        return []
    med_t, med_sm, med_fp64, med_dram = job.active_medians(f.tensor, f.sm, f.fp64, f.dram)
    mask = (job.any_active_k & (med_t < cfg.tensor_active_max) & (med_sm >= cfg.sm_active_min)
            & ~(med_fp64 >= cfg.fp64_active_max) & ~(med_dram >= cfg.dram_active_max))
    det = job.episodes(mask, cfg)
    if not det:
        return []
    em = episode_mask(det, job.w.k)
    claim = np.where(job.active, cfg.waste_fraction * np.minimum(1.0, nz(f.sm)), 0.0)
    return [make_finding(job, KIND, cfg, det, claim, {
        "tensor_active": job.stats(f.tensor, em), "sm_active": job.stats(f.sm, em),
        "fp32_active": job.stats(f.fp32, em), "fp64_active": job.stats(f.fp64, em),
        "dram_active": job.stats(f.dram, em), "threshold_tensor_active": cfg.tensor_active_max})]
