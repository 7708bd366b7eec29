"""overprovisioned_deployment: every replica has KV room, an empty queue and latency far under the
SLO; how many replicas carry the measured load with the headroom kept."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from ..config import ServingKindConfig
from ..measures import tpot_judged
from .base import DeploymentView, ServingDetector, ServingFinding, make_finding

KIND = "overprovisioned_deployment"


@dataclass(frozen=True, kw_only=True)
class Config(ServingKindConfig):
    SECTION: ClassVar[str] = KIND
    min_replicas: float
    kv_target: float
    kv_max: float
    waiting_max: float
    latency_share_max: float


def detect(view: DeploymentView, cfg: Config) -> list[ServingFinding]:
    s = view.summary
    if view.n_minutes < cfg.min_minutes or len(view.replicas) < cfg.min_replicas:
        return []
    kv = [v for m in view.minutes if (v := m.scalar("kv_usage")) is not None]
    waiting = s.waiting_mean
    ttft99 = s.latency.get("ttft", {}).get("p99")
    tpot99 = tpot_judged(s)
    if not kv or waiting is None or ttft99 is None or tpot99 is None:
        return []  # every signal is needed to call GPUs spare; missing is unknown, not idle
    kv_peak = max(kv)
    lat_share = max(ttft99 / view.slo.ttft_s, tpot99 / view.slo.tpot_s)
    if kv_peak > cfg.kv_max or waiting > cfg.waiting_max or lat_share > cfg.latency_share_max:
        return []
    # The share of today's capacity the load uses: the tighter of KV (against the use a replica may
    # be driven to) and latency (p99 against the SLO; latency grows faster than linearly with the
    # batch, so this overstates the need: the estimate errs on keeping GPUs).
    load_share = max(kv_peak / cfg.kv_target, lat_share)
    replicas = len(view.replicas)
    needed = max(1, math.ceil(replicas * load_share))
    if needed >= replicas:
        return []
    gpus_per = max(max(m.gpus for m in ms) for ms in view.replicas.values())
    gpus = sum(max(m.gpus for m in ms) for ms in view.replicas.values())
    return [make_finding(view, KIND, cfg, view.deployment, {
        "replicas": replicas, "gpus": gpus, "needed_replicas": needed, "needed_gpus": needed * gpus_per,
        "load_share": load_share, "kv_usage_max": kv_peak, "waiting_mean": waiting, "ttft_p99_s": ttft99,
        "tpot_judged_s": tpot99, "tpot_from": s.tpot_from, "judged_minutes": view.n_minutes,
        "flagged_minutes": view.n_minutes})]


DETECTOR = ServingDetector(KIND, Config, detect)
