"""The four faults the held-out serving library (bench/serving/scenarios_heldout.py) found in the
serving detectors, each pinned on small synthetic replica-minutes (pure; no simulator)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from gpufleet.analysis.serving.detectors import DeploymentView, detect_serving
from gpufleet.analysis.serving.measures import ServingMinute
from gpufleet.analysis.serving.slo import PRESETS, Slo
from gpufleet.flagkinds import flag_kinds
from gpufleet.serving_expo import Hist

SLO = PRESETS["mlperf-llama3.1-8b"]  # TTFT 2 s, TPOT 100 ms, p99


def _minutes(n_replicas: int, engine: str = "vllm", sm: float | None = None, util: float | None = None,
             minutes: int = 10, **measures: Any) -> list[ServingMinute]:
    return [ServingMinute("d", f"r{r}", m * 60, 1, engine, measures, sm, util)
            for r in range(n_replicas) for m in range(minutes)]


def _kinds(view: DeploymentView) -> dict[str, dict[str, object]]:
    found = detect_serving(view)
    reg = flag_kinds()
    for f in found:  # every finding speaks the registry's words
        assert [k for k in f.evidence if reg.evidence_field(f.kind, k) is None] == [], f.kind
    return {f.kind: f.evidence for f in found}


# latency far under the SLO, an empty queue, little KV: the picture of a spare deployment ...
FAST_TTFT = Hist((0.1, 0.5, math.inf), (50.0, 100.0, 100.0), 20.0)
FAST_TPOT = Hist((0.01, 0.03, math.inf), (20.0, 100.0, 100.0), 2.5)
LIGHT: dict[str, Any] = {"requests": 100.0, "ttft": FAST_TTFT, "tpot": FAST_TPOT, "kv_usage": 0.13, "waiting": 0.0,
                         "running": 40.0}


def test_right_sized_replicas_are_not_called_spare_by_their_latency_headroom() -> None:
    # three replicas whose GPUs are 87% busy (SM activity): latency is still flat, but two
    # replicas would carry 130% each
    got = _kinds(DeploymentView("d", SLO, _minutes(3, sm=0.87, util=0.91, **LIGHT)))
    assert "overprovisioned_deployment" not in got
    # four replicas each using 28% of their compute: two carry it at the 0.75 busy target
    ev = _kinds(DeploymentView("d", SLO, _minutes(4, sm=0.28, util=0.71, **LIGHT)))["overprovisioned_deployment"]
    assert ev["needed_replicas"] == 2 and ev["needed_gpus"] == 2 and ev["compute_from"] == "sm_active"
    assert ev["compute_used"] == pytest.approx(1.12)
    # no SM activity: NVML busy (an upper bound on the work: it counts the per-step fixed cost) sizes it
    got = _kinds(DeploymentView("d", SLO, _minutes(4, util=0.71, **LIGHT)))
    assert "overprovisioned_deployment" not in got  # 4 x 0.71 / 0.75 -> 4: nothing to drop
    ev = _kinds(DeploymentView("d", SLO, _minutes(4, util=0.2, **LIGHT)))["overprovisioned_deployment"]
    assert ev["compute_from"] == "gpu_util" and ev["needed_replicas"] == 2
    # no hardware side: the engine steps only while a request is in flight, at most
    # min(1, running + waiting) of the time; 40 running says nothing is spare ...
    assert "overprovisioned_deployment" not in _kinds(DeploymentView("d", SLO, _minutes(4, **LIGHT)))
    # ... a request in flight a fifth of the time on each of four replicas fits in two
    ev = _kinds(DeploymentView("d", SLO, _minutes(4, **{**LIGHT, "running": 0.2})))["overprovisioned_deployment"]
    assert ev["compute_from"] == "in_flight" and ev["needed_replicas"] == 2
    # no running gauge either: the capacity is unknown, not spare
    no_gauge = {k: v for k, v in LIGHT.items() if k != "running"}
    assert "overprovisioned_deployment" not in _kinds(DeploymentView("d", SLO, _minutes(4, **no_gauge)))


def test_a_miss_the_buckets_cannot_prove_is_not_flagged() -> None:
    # 2 s TTFT target inside vLLM's 1 - 2.5 s bucket: interpolated 0.987 < 0.99, proven 0.96 - 1.0
    between = Hist((1.0, 2.5, math.inf), (960.0, 1000.0, 1000.0), 700.0)
    fine_tpot = Hist((0.05, 0.1, math.inf), (1000.0, 1000.0, 1000.0), 30.0)
    ms = _minutes(1, sm=0.3, util=0.6, requests=1000.0, ttft=between, tpot=fine_tpot, running=1.0, waiting=0.0,
                  kv_usage=0.05)
    view = DeploymentView("d", SLO, ms)
    assert view.summary.ttft_attainment is not None and view.summary.ttft_attainment < 0.99
    assert view.summary.ttft_attainment_range == (0.96, 1.0)
    assert "slo_missed" not in _kinds(view)
    # the same bucket with 20 requests above 2.5 s: at most 0.98 meet it, a proven miss
    missed = Hist((1.0, 2.5, math.inf), (900.0, 980.0, 1000.0), 900.0)
    ms = _minutes(1, sm=0.3, util=0.6, requests=1000.0, ttft=missed, tpot=fine_tpot, running=1.0, waiting=0.0,
                  kv_usage=0.05)
    ev = _kinds(DeploymentView("d", SLO, ms))["slo_missed"]
    assert ev["ttft_attainment_max"] == pytest.approx(0.98)


def test_light_load_long_prompts_are_prefill_bound_not_host_bound() -> None:
    # 9 requests a minute of 16k-token prompts: the GPU is busy 14% of the minute because requests
    # are in flight about 9% of it; while they are, it is busy all the time
    slo = Slo(0.5, 0.1, 0.99, "interactive TTFT")
    slow_ttft = Hist((0.5, 1.0, 2.5, math.inf), (0.0, 5.0, 9.0, 9.0), 9.4)
    tpot = Hist((0.05, 0.1, math.inf), (9.0, 9.0, 9.0), 0.1)
    ms = _minutes(1, sm=0.12, util=0.14, requests=9.0, prompt_tokens=9 * 16000.0, ttft=slow_ttft, tpot=tpot,
                  running=0.09, waiting=0.0, kv_usage=0.03, queue_time=Hist((0.1, math.inf), (9.0, 9.0), 0.6))
    ev = _kinds(DeploymentView("d", slo, ms))["slo_missed"]
    assert ev["cause"] == "prefill_bound"
    assert ev["gpu_busy_in_flight"] == 1.0 and ev["in_flight_share_max"] == pytest.approx(0.09)
    assert ev["prompt_tokens_per_request"] == pytest.approx(16000.0)
    # a full batch (25 running) with the GPU busy 35% of the time: the host bounds the engine
    late_tpot = Hist((0.04, 0.1, math.inf), (100.0, 400.0, 400.0), 24.0)
    fast_ttft = Hist((0.5, math.inf), (400.0, 400.0), 40.0)
    ms = _minutes(1, sm=0.3, util=0.35, requests=400.0, ttft=fast_ttft, tpot=late_tpot, running=25.0,
                  waiting=0.0, kv_usage=0.07, queue_time=Hist((0.1, math.inf), (400.0, 400.0), 8.0))
    ev = _kinds(DeploymentView("d", Slo(2.0, 0.04, 0.99, "TPOT 40 ms"), ms))["slo_missed"]
    assert ev["cause"] == "host_bound" and ev["gpu_busy_in_flight"] == pytest.approx(0.35)


def test_queue_time_from_littles_law_when_the_engine_has_no_queue_series() -> None:
    # SGLang: no queue-time histogram, but num_queue_reqs averages 108 while 330 requests a minute
    # finish: 108 x 60 / 330 = 19.6 s waiting of a 19.4 s mean TTFT
    late = Hist((2.0, 10.0, 60.0, math.inf), (15.0, 60.0, 330.0, 330.0), 330 * 19.4)
    itl = Hist((0.05, 0.1, math.inf), (10000.0, 10000.0, 10000.0), 250.0)
    measures: dict[str, Any] = {"requests": 330.0, "ttft": late, "itl": itl, "running": 7.4,
                                         "kv_usage": 0.02}
    ev = _kinds(DeploymentView("d", SLO, _minutes(1, "sglang", sm=0.56, util=0.96, waiting=108.0,
                                                  **measures)))["slo_missed"]
    assert ev["cause"] == "queueing" and ev["queue_from"] == "little_estimate"
    assert ev["queue_share"] == pytest.approx(1.0)
    # without a waiting gauge the queue is unknown: not read as none, but not invented either
    ev = _kinds(DeploymentView("d", SLO, _minutes(1, "sglang", sm=0.56, util=0.96, **measures)))["slo_missed"]
    assert ev["queue_from"] is None and ev["queue_share"] is None and ev["cause"] != "queueing"
