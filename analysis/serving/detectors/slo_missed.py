"""slo_missed: the deployment's TTFT or TPOT percentile is proven over its SLO, with the measured cause.

A miss must be proven: an SLO between two bucket bounds is read by interpolation, but the buckets
prove only a range (``*_attainment_range``); the flag needs the top of that range under the SLO's
percentile. When only the interpolated estimate is under it, nothing is raised: the deployment
page shows the estimate with its proven range ("estimated; proven a - b"), and an unknown is not a
miss. TPOT from the per-token series alone (no per-request histogram) is its mean against the
target (see ``tpot_judged``).

Causes, first that fits: KV pressure (preemptions), host-bound (the GPUs run kernels only part of
the time requests are in flight: NVML utilisation, not SM activity, which a small memory-bound batch
keeps low, over the share of time with a running request), queueing (most of TTFT spent waiting:
the queue-time series, or by Little's law the mean waiting requests over the request rate when the
engine has a waiting gauge but no queue-time series), prefill-bound (TTFT late without queueing:
long prompts' prefill), decode-bound (TPOT late)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..config import ServingKindConfig
from ..measures import ServingSummary, tpot_judged
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


def proven_late(rng: tuple[float, float] | None, pct: float) -> bool:
    """The buckets prove fewer than ``pct`` of the requests within the target."""
    return rng is not None and rng[1] < pct


def queue_time(view: DeploymentView, s: ServingSummary) -> tuple[float | None, str | None]:
    """Mean queue time per request and where it comes from: the engine's queue-time series, or
    Little's law (time-averaged waiting requests / request rate) when the engine exports a waiting
    gauge but no queue-time series (SGLang's num_queue_reqs); None when neither is known."""
    if s.queue_mean_s is not None:
        return s.queue_mean_s, "queue_time"
    waiting = [(v, m) for m in view.minutes if (v := m.scalar("waiting")) is not None]
    served = [m.scalar("requests") for _, m in waiting]
    if not waiting or any(r is None for r in served):
        return None, None
    requests = sum(r for r in served if r is not None)
    if requests <= 0:
        return None, None
    # sum over replica-minutes of (mean waiting x 60 s) is the request-seconds spent waiting
    return sum(v for v, _ in waiting) * 60.0 / requests, "little_estimate"


def in_flight_share(s: ServingSummary) -> float | None:
    """An upper bound on the share of time a replica has a running request: the running gauge is a
    whole number, so P(running >= 1) <= E[running] (and <= 1)."""
    return None if s.batch_size_mean is None else min(1.0, s.batch_size_mean)


def detect(view: DeploymentView, cfg: Config) -> list[ServingFinding]:
    s = view.summary
    if view.n_minutes < cfg.min_minutes or not s.requests or s.requests < cfg.min_requests:
        return []
    pct = view.slo.percentile
    ttft_late = proven_late(s.ttft_attainment_range, pct)
    tpot = tpot_judged(s)
    if s.tpot_from == "itl":  # per-token only: the mean against the target (see tpot_judged)
        tpot_late = tpot is not None and tpot > view.slo.tpot_s
    else:
        tpot_late = proven_late(s.tpot_attainment_range, pct)
    if not (ttft_late or tpot_late):
        return []
    ttft_mean = s.latency.get("ttft", {}).get("mean")
    queue_s, queue_from = queue_time(view, s)
    queue_share = min(1.0, queue_s / ttft_mean) if queue_s is not None and ttft_mean else None
    preempt_rate = (s.preemptions or 0.0) / s.requests
    kv_full = s.kv_usage_max is not None and s.kv_usage_max >= cfg.kv_full
    # busy share of the time requests are in flight: a lightly loaded replica's GPU idles for want of work
    flight = in_flight_share(s)
    busy_in_flight = (min(1.0, s.gpu_util_mean / flight) if s.gpu_util_mean is not None and flight
                      else None)
    prompt_per_request = (s.prompt_tokens_per_gpu_s * s.gpu_seconds / s.requests
                          if s.prompt_tokens_per_gpu_s is not None else None)
    # an engine without a preemption series (SGLang retracts without one here): a full cache with a queue
    if preempt_rate >= cfg.preemption_rate or (kv_full and (s.preemptions or 0) > 0) or (
            kv_full and s.preemptions is None and (s.waiting_mean or 0.0) >= 1.0):
        cause = "kv_pressure"
    elif busy_in_flight is not None and busy_in_flight < cfg.host_gpu_util:
        cause = "host_bound"
    elif ttft_late and queue_share is not None and queue_share >= cfg.queue_share:
        cause = "queueing"
    elif ttft_late and (not tpot_late or (s.ttft_attainment or 0) <= (s.tpot_attainment or 0)):
        cause = "prefill_bound"
    else:
        cause = "decode_bound"
    return [make_finding(view, KIND, cfg, view.deployment, {
        "cause": cause, "ttft_attainment": s.ttft_attainment, "tpot_attainment": s.tpot_attainment,
        "ttft_attainment_max": s.ttft_attainment_range[1] if s.ttft_attainment_range else None,
        "tpot_attainment_max": s.tpot_attainment_range[1] if s.tpot_attainment_range else None,
        "slo_percentile": pct, "slo_ttft_s": view.slo.ttft_s, "slo_tpot_s": view.slo.tpot_s,
        "ttft_p99_s": s.latency.get("ttft", {}).get("p99"),
        "tpot_judged_s": tpot, "tpot_from": s.tpot_from, "queue_share": queue_share, "queue_from": queue_from,
        "waiting_mean": s.waiting_mean, "kv_usage_max": s.kv_usage_max,
        "preemptions_per_minute": (s.preemptions or 0.0) / max(view.n_minutes, 1),
        "sm_active_mean": s.sm_active_mean, "gpu_util_mean": s.gpu_util_mean,
        "gpu_busy_in_flight": busy_in_flight, "in_flight_share_max": flight,
        "batch_size_mean": s.batch_size_mean, "prompt_tokens_per_request": prompt_per_request,
        "judged_minutes": view.n_minutes, "flagged_minutes": view.n_minutes})]


DETECTOR = ServingDetector(KIND, Config, detect)
