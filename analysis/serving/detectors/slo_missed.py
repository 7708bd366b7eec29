"""slo_missed: the deployment's TTFT or TPOT percentile is over its SLO, with the measured cause.

Causes, first that fits: KV pressure (preemptions), host-bound (the GPUs run kernels only part of
the time while late: NVML utilisation, not SM activity, which a small memory-bound batch keeps low),
queueing (most of TTFT spent waiting), prefill-bound (TTFT late without queueing), decode-bound
(TPOT late)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..config import ServingKindConfig
from ..measures import tpot_judged
from .base import DeploymentView, ServingDetector, ServingFinding, make_finding

KIND = "slo_missed"


@dataclass(frozen=True, kw_only=True)
class Config(ServingKindConfig):
    SECTION: ClassVar[str] = KIND
    min_requests: float
    queue_share: float
    preemption_rate: float
    kv_full: float
    host_gpu_util: float


def detect(view: DeploymentView, cfg: Config) -> list[ServingFinding]:
    s = view.summary
    if view.n_minutes < cfg.min_minutes or not s.requests or s.requests < cfg.min_requests:
        return []
    pct = view.slo.percentile
    ttft_late = s.ttft_attainment is not None and s.ttft_attainment < pct
    tpot = tpot_judged(s)
    if s.tpot_from == "itl":  # per-token only: the mean against the target (see tpot_judged)
        tpot_late = tpot is not None and tpot > view.slo.tpot_s
    else:
        tpot_late = s.tpot_attainment is not None and s.tpot_attainment < pct
    if not (ttft_late or tpot_late):
        return []
    ttft_mean = s.latency.get("ttft", {}).get("mean")
    queue_share = s.queue_mean_s / ttft_mean if s.queue_mean_s is not None and ttft_mean else None
    preempt_rate = (s.preemptions or 0.0) / s.requests
    kv_full = s.kv_usage_max is not None and s.kv_usage_max >= cfg.kv_full
    # an engine without a preemption series (SGLang retracts without one here): a full cache with a queue
    if preempt_rate >= cfg.preemption_rate or (kv_full and (s.preemptions or 0) > 0) or (
            kv_full and s.preemptions is None and (s.waiting_mean or 0.0) >= 1.0):
        cause = "kv_pressure"
    elif s.gpu_util_mean is not None and s.gpu_util_mean < cfg.host_gpu_util:
        cause = "host_bound"
    elif ttft_late and queue_share is not None and queue_share >= cfg.queue_share:
        cause = "queueing"
    elif ttft_late and (not tpot_late or (s.ttft_attainment or 0) <= (s.tpot_attainment or 0)):
        cause = "prefill_bound"
    else:
        cause = "decode_bound"
    return [make_finding(view, KIND, cfg, view.deployment, {
        "cause": cause, "ttft_attainment": s.ttft_attainment, "tpot_attainment": s.tpot_attainment,
        "slo_percentile": pct, "slo_ttft_s": view.slo.ttft_s, "slo_tpot_s": view.slo.tpot_s,
        "ttft_p99_s": s.latency.get("ttft", {}).get("p99"),
        "tpot_judged_s": tpot, "tpot_from": s.tpot_from, "queue_share": queue_share,
        "waiting_mean": s.waiting_mean, "kv_usage_max": s.kv_usage_max,
        "preemptions_per_minute": (s.preemptions or 0.0) / max(view.n_minutes, 1),
        "sm_active_mean": s.sm_active_mean, "gpu_util_mean": s.gpu_util_mean, "batch_size_mean": s.batch_size_mean,
        "judged_minutes": view.n_minutes, "flagged_minutes": view.n_minutes})]


DETECTOR = ServingDetector(KIND, Config, detect)
