"""oversized_allocation: some GPUs of the job idle while their peers work."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..config import KindConfig
from ..windows import episode_mask, share
from .base import Finding, Found, JobView, Signals, make_finding

KIND = "oversized_allocation"
SIGNALS = Signals(needs=("sm_active",), fallback=("gpu_util",), corroborate=("power_w",))


@dataclass(frozen=True, kw_only=True)
class Config(KindConfig):
    SECTION: ClassVar[str] = KIND
    min_idle_share: float  # at least this share of the job's GPUs idle


def detect(job: JobView, cfg: Config, found: Found) -> list[Finding]:
    g = job.n_gpus
    if g < 2:
        return []
    if cfg.min_idle_share > 0 and not job.idle.any():
        return []  # no GPU idle anywhere: no idle share reaches a positive minimum
    idle_share = share(job.idle, job.judged)
    det = job.episodes(job.any_active_k & (idle_share >= cfg.min_idle_share), cfg)
    if not det:
        return []
    em = episode_mask(det, job.w.k)
    idle_gpus = (job.idle & em[None, :]).sum(axis=1) >= 0.5 * em.sum()
    return [make_finding(job, KIND, cfg, det, job.idle.astype(float), {
        "n_gpus": g, "idle_gpus": int(idle_gpus.sum()), "used_gpus": int(g - idle_gpus.sum()),
        "idle_gpu_uuids": [u for u, i in zip(job.ctx.gpu_uuids, idle_gpus, strict=True) if i][:16],
        "active_sm_active": job.stats(job.w.f.sm, em)})]
