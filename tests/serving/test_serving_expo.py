"""Engine metric pages -> serving measures, and scrape deltas (gpufleet/serving_expo.py)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from gpufleet.serving_expo import ExpositionError, Hist, delta, fold, parse_exposition, snapshot
from gpufleet.serving_metrics import parse_registry, serving_registry

FIXTURES = Path(__file__).with_name("fixtures")


def page(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_registry_loads_and_every_engine_cites_its_docs() -> None:
    reg = serving_registry()
    assert set(reg.engines) == {"vllm", "sglang", "tgi", "triton", "dynamo"}
    for eng in reg.engines.values():
        assert eng.docs.startswith("https://")
        assert eng.metrics


@pytest.mark.parametrize(("text", "why"), [
    ('[measure.x]\nkind = "pie"\nunit = "count"\nagg = "sum"\n', "measure x: kind 'pie'"),
    ('[measure.x]\nkind = "counter"\nunit = "count"\nagg = "sum"\n[engine.e]\ndocs = "u"\n'
     '[[engine.e.metric]]\nname = "a"\nmeasure = "y"\n', "measure 'y' is not declared"),
    ('[measure.x]\nkind = "gauge"\nunit = "count"\nagg = "sum"\n[engine.e]\ndocs = "u"\n'
     '[[engine.e.metric]]\nname = "a"\nmeasure = "x"\nfrom = "sum"\n', "feeds only a counter"),
    ('[engine.e]\n', "docs"),
])
def test_registry_refuses_bad_entries_by_name(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_registry(text)


def test_vllm_v0_page_maps_old_names() -> None:
    snap = snapshot(parse_exposition(page("vllm_v0.txt")), "vllm")
    assert snap["requests"] == 1000.0  # two finished_reason series summed
    assert snap["prompt_tokens"] == 1.2e6
    assert snap["generation_tokens"] == 45000.0
    assert snap["preemptions"] == 3.0
    assert snap["running"] == 7.0 and snap["waiting"] == 2.0
    assert snap["kv_usage"] == 0.35  # gpu_cache_usage_perc, the pre-V1 name
    ttft = snap["ttft"]
    assert isinstance(ttft, Hist)
    assert ttft.bounds == (0.1, 0.25, 0.5, 1.0, 2.5, math.inf)
    assert ttft.cum == (100.0, 400.0, 800.0, 950.0, 990.0, 1000.0)
    assert ttft.sum == 310.5
    itl = snap["itl"]  # time_per_output_token_seconds: per-token observations, the old ITL name
    assert isinstance(itl, Hist) and itl.count == 44000.0
    assert "tpot" not in snap  # no per-request TPOT histogram on this version: unknown, not zero
    assert "queue_time" not in snap


def test_vllm_v1_data_parallel_engines_sum_and_kv_averages() -> None:
    snap = snapshot(parse_exposition(page("vllm_v1_dp2.txt")), "vllm")
    assert snap["running"] == 10.0
    assert snap["kv_usage"] == pytest.approx(0.375)
    assert snap["requests"] == 22.0
    ttft = snap["ttft"]
    assert isinstance(ttft, Hist)
    assert ttft.cum == (11.0, 22.0) and ttft.sum == pytest.approx(3.5)


def test_tgi_tokens_from_histogram_sums_and_counter_without_total() -> None:
    snap = snapshot(parse_exposition(page("tgi.txt")), "tgi")
    assert snap["requests"] == 40.0
    assert snap["prompt_tokens"] == 12000.0 and snap["generation_tokens"] == 3000.0
    assert snap["waiting"] == 3.0 and snap["running"] == 12.0
    assert isinstance(snap["tpot"], Hist)
    assert "ttft" not in snap  # TGI exposes no time-to-first-token series


def test_triton_units_scaled_to_seconds() -> None:
    snap = snapshot(parse_exposition(page("triton.txt")), "triton")
    ttft = snap["ttft"]
    assert isinstance(ttft, Hist)
    assert ttft.bounds == (0.1, 0.5, 2.0, math.inf)
    assert ttft.sum == pytest.approx(60.0)
    assert snap["queue_time_total"] == pytest.approx(4.0)
    assert snap["inferences"] == 200.0 and snap["executions"] == 25.0


def test_dynamo_frontend() -> None:
    snap = snapshot(parse_exposition(page("dynamo.txt")), "dynamo")
    assert snap["requests"] == 32.0
    assert snap["generation_tokens"] == 5000.0  # from the output-length histogram's _sum
    assert snap["running"] == 4.0
    assert isinstance(snap["ttft"], Hist)


def test_parser_reads_escapes_timestamps_and_refuses_garbage_with_its_line() -> None:
    samples = parse_exposition('a{x="q\\"u\\\\o",y="n\\nl"} 1.5 1700000000000\nb NaN\nc +Inf\n')
    assert samples[0].labels == (("x", 'q"u\\o'), ("y", "n\nl"))
    assert samples[0].value == 1.5
    assert math.isnan(samples[1].value) and samples[2].value == math.inf
    with pytest.raises(ExpositionError, match="line 2"):
        parse_exposition("ok 1\nthis is not a sample\n")
    with pytest.raises(ExpositionError, match="not a number"):
        parse_exposition("a{b=\"c\"} twelve\n")


def _vllm(requests: float, ttft_cum: tuple[float, ...], running: float) -> str:
    lines = [f'vllm:request_success_total{{finished_reason="stop"}} {requests}',
             f"vllm:num_requests_running {running}"]
    for le, c in zip(("0.1", "1.0", "+Inf"), ttft_cum, strict=True):
        lines.append(f'vllm:time_to_first_token_seconds_bucket{{le="{le}"}} {c}')
    lines.append(f"vllm:time_to_first_token_seconds_sum {ttft_cum[-1] * 0.2}")
    return "\n".join(lines) + "\n"


def test_delta_fold_and_restart() -> None:
    s0 = snapshot(parse_exposition(_vllm(10, (5, 9, 10), 2)), "vllm")
    s1 = snapshot(parse_exposition(_vllm(30, (15, 27, 30), 4)), "vllm")
    s2 = snapshot(parse_exposition(_vllm(3, (1, 2, 3), 6)), "vllm")  # the engine restarted
    first = delta(None, s0)
    assert first == {"running": 2.0}  # increases unknown on first sight
    d1, d2 = delta(s0, s1), delta(s1, s2)
    assert d1["requests"] == 20.0
    h1 = d1["ttft"]
    assert isinstance(h1, Hist) and h1.cum == (10.0, 18.0, 20.0)
    assert d2["requests"] == 3.0  # counts since the restart
    minute = fold([first, d1, d2])
    assert minute["requests"] == 23.0
    assert minute["running"] == 4.0  # mean of the minute's gauges
    h = minute["ttft"]
    assert isinstance(h, Hist) and h.cum == (11.0, 20.0, 23.0)


def test_fold_merges_histograms_on_shared_bounds() -> None:
    a = Hist((0.1, 0.5, math.inf), (1.0, 3.0, 4.0), 1.0)
    b = Hist((0.1, 0.25, math.inf), (2.0, 2.0, 2.0), 0.2)
    m = fold([{"ttft": a}, {"ttft": b}])["ttft"]
    assert isinstance(m, Hist) and m.bounds == (0.1, math.inf) and m.cum == (3.0, 6.0)
