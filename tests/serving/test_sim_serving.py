"""The serving simulator's physics and its engine pages (agent/sim_serving.py)."""

from __future__ import annotations

import statistics

import pytest

from gpufleet.agent.sim_serving import EngineModel, Workload, arrivals, simulate
from gpufleet.serving_expo import Hist, parse_exposition, snapshot


def test_poisson_and_bursty_arrivals_keep_the_mean_rate() -> None:
    calm = arrivals(Workload(rate_rps=10, duration_s=600, seed=1))
    bursty = arrivals(Workload(rate_rps=10, duration_s=600, burst_factor=3.0, seed=1))
    assert len(calm) / 600 == pytest.approx(10, rel=0.05)
    assert len(bursty) / 600 == pytest.approx(10, rel=0.08)

    def per_10s(reqs: list) -> list[int]:
        counts = [0] * 60
        for r in reqs:
            counts[int(r.arrival // 10)] += 1
        return counts
    # bursts: the 10 s counts spread far more than a Poisson process's (variance = mean)
    assert statistics.pvariance(per_10s(bursty)) > 5 * statistics.pvariance(per_10s(calm))


def test_prefill_time_grows_with_prompt_tokens() -> None:
    model = EngineModel()
    short = simulate(model, Workload(rate_rps=0.5, duration_s=120, prompt_tokens=(100, 100), seed=2))
    long = simulate(model, Workload(rate_rps=0.5, duration_s=120, prompt_tokens=(4000, 4000), seed=2))
    assert statistics.median(r.ttft for r in long.finished()) > 5 * statistics.median(
        r.ttft for r in short.finished())


def test_decode_time_grows_with_batch_size() -> None:
    model = EngineModel()
    light = simulate(model, Workload(rate_rps=1, duration_s=120, seed=3))
    heavy = simulate(model, Workload(rate_rps=20, duration_s=120, seed=3))
    assert statistics.median(r.tpot for r in heavy.finished()) > 1.5 * statistics.median(
        r.tpot for r in light.finished())


def test_kv_capacity_preempts_and_every_request_finishes() -> None:
    small = EngineModel(kv_capacity_tokens=12_000)
    res = simulate(small, Workload(rate_rps=8, duration_s=90, seed=4))
    assert len(res.finished()) == len(res.requests)
    assert sum(r.preemptions for r in res.requests) > 0
    last = snapshot(parse_exposition(res.pages[-1][1]), "vllm")
    assert last["preemptions"] == sum(r.preemptions for r in res.requests)
    with pytest.raises(ValueError, match="KV cache"):
        simulate(EngineModel(kv_capacity_tokens=100), Workload(rate_rps=1, duration_s=10))


@pytest.mark.parametrize("engine", ["vllm", "sglang", "tgi"])
def test_rendered_pages_parse_back_to_the_ground_truth(engine: str) -> None:
    res = simulate(EngineModel(), Workload(rate_rps=4, duration_s=60, seed=5), engine=engine)
    snap = snapshot(parse_exposition(res.pages[-1][1]), engine)
    done = res.finished()
    assert snap["requests"] == len(done)
    assert snap["generation_tokens"] == sum(r.output for r in done)
    e2e = snap["e2e"]
    assert isinstance(e2e, Hist) and e2e.count == len(done)
    assert e2e.sum == pytest.approx(sum(r.e2e for r in done))
    if engine != "tgi":  # TGI has no TTFT series
        ttft = snap["ttft"]
        assert isinstance(ttft, Hist) and ttft.sum == pytest.approx(sum(r.ttft for r in done))
    assert snap["running"] == 0.0 and snap["waiting"] == 0.0  # drained
