"""comm_bound: NVLink or InfiniBand near capacity while the SMs wait.

InfiniBand fields are the GPU's own only when its agent mapped an HCA to it (PCIe switch or
NUMA affinity); otherwise every GPU of a node carries the node's total (gpufleet/catalog.toml).
A node-level counter is read as the job's only when the job spans several nodes (its
collectives then cross the fabric); a job on one node gets no ``comm_bound`` from a
neighbour's traffic: its evidence says the IB figure was node-level and not attributed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..config import KindConfig
from ..windows import episode_mask, masked_median, nz, nz_lt, share
from .base import Finding, Found, JobView, Signals, make_finding, r3

KIND = "comm_bound"
SIGNALS = Signals(needs=("sm_active", "links"))


@dataclass(frozen=True, kw_only=True)
class Config(KindConfig):
    SECTION: ClassVar[str] = KIND
    link_util_min: float  # NVLink or IB throughput / link capacity
    sm_active_max: float
    gpu_share_min: float


def link_utilisation(job: JobView) -> tuple[np.ndarray, np.ndarray]:
    """(NVLink, IB) throughput over the model's per-direction capacity; NaN where not measured."""
    f, lim = job.w.f, job.ctx.limits
    nan = np.full_like(f.sm, np.nan)
    with np.errstate(invalid="ignore"):
        nvl = np.fmax(f.nvl_tx, f.nvl_rx) / lim.nvlink_bytes_s if lim.nvlink_bytes_s > 0 else nan
        ib = np.fmax(f.ib_tx, f.ib_rx) / lim.ib_bytes_s if lim.ib_bytes_s > 0 else nan
    return nvl, ib


PER_GPU_MODES = ("pcie", "numa")  # the agent's HCA-to-GPU mappings that give a GPU its own rail


def ib_attribution(job: JobView) -> tuple[np.ndarray, str]:
    """(G,) GPUs whose IB fields count as their own traffic, and why (the evidence's words)."""
    modes: dict[str, str] = getattr(job.fabric, "rail_modes", None) or {}
    own = np.array([modes.get(u) in PER_GPU_MODES for u in job.ctx.gpu_uuids], dtype=bool)
    if own.all() and own.size:
        return own, "per GPU (HCA affinity known)"
    if len(set(job.ctx.gpu_nodes)) > 1:
        return np.ones(job.n_gpus, dtype=bool), "per node (the job spans several nodes: its collectives cross IB)"
    if own.any():
        return own, "per GPU where HCA affinity is known, else node-level: not attributed"
    return own, "node-level (HCA affinity unknown, one-node job): not attributed to the job"


def detect(job: JobView, cfg: Config, found: Found) -> list[Finding]:
    f, lim = job.w.f, job.ctx.limits
    nvl, ib = link_utilisation(job)
    own, ib_basis = ib_attribution(job)
    ib = np.where(own[:, None], ib, np.nan)
    link = np.fmax(nz(nvl), nz(ib))
    per_gpu = job.active & (link >= cfg.link_util_min) & nz_lt(f.sm, cfg.sm_active_max, nan=1.0)
    if cfg.gpu_share_min > 0 and not per_gpu.any():
        return []  # no GPU-window qualifies: no share reaches a positive minimum, no episode
    det = job.episodes(job.any_active_k & (share(per_gpu, job.active) >= cfg.gpu_share_min), cfg)
    if not det:
        return []
    em = episode_mask(det, job.w.k)
    target = job.general.target_sm_active
    claim = np.where(per_gpu, 1.0 - np.minimum(1.0, nz(f.sm) / target), 0.0)
    return [make_finding(job, KIND, cfg, det, claim, {
        "nvlink_util": r3(np.nanmedian(masked_median(nz(nvl), job.active)[em])),
        "ib_util": r3(np.nanmedian(masked_median(nz(ib), job.active)[em])), "ib_attribution": ib_basis,
        "sm_active": job.stats(f.sm, em), "threshold_link_util": cfg.link_util_min,
        "link_capacity_bytes_s": {"nvlink": lim.nvlink_bytes_s, "ib": lim.ib_bytes_s}})]
