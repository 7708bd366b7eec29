"""The serving flag kinds on the evaluation library (bench/serving/scenarios.py) and on edge cases.

The library's precision/recall table over several seeds is bench/serving/evaluate.py's job (figures
in docs/serving.md); here one seed must raise every labelled kind on its scenario and nothing on the
healthy ones, and every finding must speak the registry's words."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from gpufleet.analysis.serving.detectors import SERVING_DETECTORS, DeploymentView, detect_serving
from gpufleet.analysis.serving.detectors.idle_replica import idle_stretch
from gpufleet.analysis.serving.measures import ServingMinute
from gpufleet.analysis.serving.slo import PRESETS
from gpufleet.flagkinds import flag_kinds
from gpufleet.serving_expo import Hist

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "serving"))
from scenarios import LIBRARY, run

SERVING_KINDS = {k.name for k in flag_kinds().kinds if k.source == "serving"}


def test_the_library_covers_every_serving_kind_and_has_healthy_cases() -> None:
    labelled = set().union(*(s.labels for s in LIBRARY)) | {"slo_missed"}
    assert labelled == SERVING_KINDS == {d.kind for d in SERVING_DETECTORS}
    assert sum(1 for s in LIBRARY if s.name.startswith("healthy")) >= 3
    assert all(s.source for s in LIBRARY)


@pytest.mark.parametrize("scenario", LIBRARY, ids=lambda s: s.name)
def test_scenario_raises_what_its_guide_expects(scenario) -> None:  # type: ignore[no-untyped-def]
    r = run(scenario, seed=0)
    found = detect_serving(r.view)
    assert {f.kind for f in found} == r.expected(), [(f.kind, f.evidence) for f in found]
    reg = flag_kinds()
    for f in found:
        undeclared = [k for k in f.evidence if reg.evidence_field(f.kind, k) is None]
        assert undeclared == [], f"{f.kind} writes undeclared evidence {undeclared}"
        assert "n/a" not in f.suggestion, f.suggestion
        assert f.scope == reg.get(f.kind).scope


def _minute(replica: str, minute: int, **measures: float | Hist) -> ServingMinute:
    return ServingMinute("d", replica, minute * 60, 1, "vllm", measures, None)


def test_idle_stretch_survives_a_stray_request() -> None:
    counts = [0.0] * 10 + [1.0] + [0.0] * 10
    assert idle_stretch(counts, 1.0) == (0, 21)
    assert idle_stretch([5.0, 5.0], 1.0) == (0, 0)


def test_unknown_is_not_idle_and_not_spare() -> None:
    # no request counter, no KV gauge: nothing to judge, nothing raised
    ms = [_minute(f"r{r}", m, running=0.0, waiting=0.0) for r in range(3) for m in range(30)]
    assert detect_serving(DeploymentView("d", PRESETS["mlperf-llama3.1-8b"], ms)) == []


def test_over_provisioned_estimate_keeps_the_headroom() -> None:
    ttft = Hist((0.1, 0.25, math.inf), (90.0, 100.0, 100.0), 8.0)
    tpot = Hist((0.01, 0.025, math.inf), (100.0, 100.0, 100.0), 0.8)
    ms = [ServingMinute("d", f"r{r}", m * 60, 1, "vllm", {"requests": 100.0, "ttft": ttft, "tpot": tpot,
                                                          "kv_usage": 0.2, "waiting": 0.0, "running": 3.0}, 0.15)
          for r in range(4) for m in range(10)]
    found = detect_serving(DeploymentView("d", PRESETS["mlperf-llama3.1-8b"], ms))
    assert [f.kind for f in found] == ["overprovisioned_deployment"]
    ev = found[0].evidence
    # KV 0.2 of a 0.8 target is a quarter of today's capacity, 4 x 0.15 SM activity is 0.8 of a
    # replica at the 0.75 busy target: 4 replicas' load fits in 1
    assert ev["load_share"] == pytest.approx(0.25) and ev["needed_replicas"] == 1 and ev["needed_gpus"] == 1
    assert ev["compute_used"] == pytest.approx(0.6)
    assert "fits in 1" in found[0].suggestion


def test_serving_ledger_minute_adds_up() -> None:
    from gpufleet.analysis.serving.ledger import serving_ledger_minute

    slo = PRESETS["mlperf-llama3.1-8b"]
    ttft = Hist((1.0, 2.0, math.inf), (80.0, 90.0, 100.0), 50.0)  # 90% within 2 s
    tpot = Hist((0.05, 0.1, math.inf), (95.0, 100.0, 100.0), 3.0)  # all within 100 ms
    m = ServingMinute("d", "r", 0, 2, "vllm", {"requests": 100.0, "ttft": ttft, "tpot": tpot})
    got = serving_ledger_minute(m, slo)
    assert sum(got.values()) == pytest.approx(120.0)
    assert got["productive"] == pytest.approx(120.0 * 0.9)
    assert got["slo_missed"] == pytest.approx(120.0 * 0.1)
    idle = ServingMinute("d", "r", 0, 2, "vllm", {"requests": 0.0})
    assert serving_ledger_minute(idle, slo) == {"idle_replica": 120.0}
    assert serving_ledger_minute(ServingMinute("d", "r", 0, 2, "vllm", {"running": 1.0}), slo) == {"unobserved": 120.0}
