"""pipeline_imbalance: one GPU or node busier than its peers at equal clocks, with no throttle
reasons or errors: the heaviest pipeline stage doing its share while the lighter stages wait
(deviants found as for stragglers, in ``straggler.deviants``; only those without a hardware
signature land here)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..config import KindConfig
from ..windows import nz
from .base import Finding, Found, JobView, Signals, make_finding
from .straggler import Config as StragglerConfig
from .straggler import deviants, med_over

KIND = "pipeline_imbalance"
SIGNALS = Signals(needs=("sm_active", "sm_clock_mhz"))


@dataclass(frozen=True, kw_only=True)
class Config(KindConfig):
    SECTION: ClassVar[str] = KIND
    min_sm_gap: float  # the busiest stage's SM activity this much above the others' (absolute)


def detect(job: JobView, cfg: Config, found: Found) -> list[Finding]:
    plain = [d for d in deviants(job, job.th.get(StragglerConfig)) if not d.signature]
    out: list[Finding] = []
    for d in plain:
        with np.errstate(invalid="ignore", divide="ignore"):
            gap = d.s_sm - d.p_sm
            wait = np.clip(1.0 - d.p_sm / d.s_sm, 0.0, 1.0)  # (K,) the lighter stages' waiting share
        mask = d.em & (nz(gap) >= cfg.min_sm_gap)
        det = job.episodes(mask, cfg)
        if not det:
            continue
        em = mask
        claim = np.where(d.peers, nz(wait)[None, :], 0.0)
        out.append(make_finding(job, KIND, cfg, det, claim, {
            "busiest_gpus": [u for u, r in zip(job.ctx.gpu_uuids, d.rows, strict=True) if r][:16],
            "sm_active_busiest": med_over(d.s_sm, em), "sm_active_others": med_over(d.p_sm, em),
            "sm_clock_mhz": med_over(d.s_ck, em), "peers_sm_clock_mhz": med_over(d.p_ck, em),
            "others_wait_fraction": med_over(wait, em)}))
        break  # one finding per job: the stages are one imbalance, whichever GPU is busiest
    return out
