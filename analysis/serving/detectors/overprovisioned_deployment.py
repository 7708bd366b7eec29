"""overprovisioned_deployment: every replica has KV room, an empty queue and latency far under the
SLO, and the GPUs' measured compute use says fewer replicas carry the load with headroom kept.

How many replicas the load needs comes from the work the GPUs do, not from latency: queueing
latency stays flat until a replica nears saturation and then rises steeply, so a p99 at a quarter
of the SLO says nothing about how close a replica is to its knee. The compute a replica uses is
its GPUs' SM activity; NVML utilisation (the share of time any kernel ran) when no SM activity is
known; with neither, the engine's own bound (it steps only while a request is in flight, at most
min(1, mean running + waiting) of the time). Summed over the replicas in the busiest minute it is
the load in replica-equivalents. A replica may be driven to ``busy_target`` of its compute before
queueing delay knees (M/M/1: the wait is rho/(1 - rho) service times, 3x at 0.75), so the load
needs ``ceil(load / busy_target)`` replicas (and the KV room it uses, against ``kv_target``).
All three count the fixed per-step cost (weights read every iteration) that a fuller batch
amortises, so they overstate the need: the estimate errs on keeping GPUs. A deployment with none
of the three is not judged (its capacity is unknown, not spare)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from ..config import ServingKindConfig
from ..measures import ServingMinute, tpot_judged
from .base import DeploymentView, ServingDetector, ServingFinding, make_finding

KIND = "overprovisioned_deployment"


@dataclass(frozen=True, kw_only=True)
class Config(ServingKindConfig):
    SECTION: ClassVar[str] = KIND
    min_replicas: float
    kv_target: float
    busy_target: float
    kv_max: float
    waiting_max: float
    latency_share_max: float


def _in_flight(m: ServingMinute) -> float | None:
    """The engine-side bound on a minute's busy share: the engine steps only while a request is in
    flight, and the running and waiting counts are whole numbers, so P(any in flight) <= their mean."""
    running = m.scalar("running")
    return None if running is None else min(1.0, running + (m.scalar("waiting") or 0.0))


def _peak(view: DeploymentView, value: Callable[[ServingMinute], float | None]) -> float | None:
    """The busiest minute's sum over the replicas (a replica without a value that minute counts as
    the others' mean); None when some replica never has one."""
    if not all(any(value(m) is not None for m in ms) for ms in view.replicas.values()):
        return None
    by_minute: dict[int, list[float]] = {}
    for m in view.minutes:
        v = value(m)
        if v is not None:
            by_minute.setdefault(m.minute, []).append(v)
    n = len(view.replicas)
    return max((sum(vs) / len(vs) * n for vs in by_minute.values()), default=None)


COMPUTE: tuple[tuple[str, Callable[[ServingMinute], float | None]], ...] = (
    ("sm_active", lambda m: m.sm_active), ("gpu_util", lambda m: m.gpu_util), ("in_flight", _in_flight))


def compute_load(view: DeploymentView) -> tuple[float, str] | None:
    """The busiest minute's compute use in replica-equivalents and which measure gave it: the GPUs'
    SM activity, else NVML utilisation, else the engine's bound min(1, running + waiting); None
    when some replica has none of them."""
    for name, value in COMPUTE:
        peak = _peak(view, value)
        if peak is not None:
            return peak, name
    return None


def detect(view: DeploymentView, cfg: Config) -> list[ServingFinding]:
    s = view.summary
    if view.n_minutes < cfg.min_minutes or len(view.replicas) < cfg.min_replicas:
        return []
    kv = [v for m in view.minutes if (v := m.scalar("kv_usage")) is not None]
    waiting = s.waiting_mean
    ttft99 = s.latency.get("ttft", {}).get("p99")
    tpot99 = tpot_judged(s)
    load = compute_load(view)
    if not kv or waiting is None or ttft99 is None or tpot99 is None or load is None:
        return []  # every signal is needed to call GPUs spare; missing is unknown, not idle
    kv_peak = max(kv)
    lat_share = max(ttft99 / view.slo.ttft_s, tpot99 / view.slo.tpot_s)
    if kv_peak > cfg.kv_max or waiting > cfg.waiting_max or lat_share > cfg.latency_share_max:
        return []
    replicas = len(view.replicas)
    compute_used, compute_from = load
    # replicas the load needs: compute at the busy target, and KV at its target (a replica's KV use
    # grows with the requests it holds, so the peak scales with the replicas' load)
    need_exact = max(compute_used / cfg.busy_target, replicas * kv_peak / cfg.kv_target)
    needed = max(1, math.ceil(need_exact - 1e-9))
    if needed >= replicas:
        return []
    gpus_per = max(max(m.gpus for m in ms) for ms in view.replicas.values())
    gpus = sum(max(m.gpus for m in ms) for ms in view.replicas.values())
    return [make_finding(view, KIND, cfg, view.deployment, {
        "replicas": replicas, "gpus": gpus, "needed_replicas": needed, "needed_gpus": needed * gpus_per,
        "load_share": need_exact / replicas, "compute_used": compute_used, "compute_from": compute_from,
        "busy_target": cfg.busy_target, "generation_tokens_per_gpu_s": s.generation_tokens_per_gpu_s,
        "kv_usage_max": kv_peak, "waiting_mean": waiting, "ttft_p99_s": ttft99,
        "tpot_judged_s": tpot99, "tpot_from": s.tpot_from, "judged_minutes": view.n_minutes,
        "flagged_minutes": view.n_minutes})]


DETECTOR = ServingDetector(KIND, Config, detect)
