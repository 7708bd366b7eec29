"""A replica's minutes in the GPU-time ledger (pure): the cells the runner folds, the
over-provisioning share a flag's episode moves out of productive, and each serving flag's share
of the stored ledger (analysis/flag_shares.py)."""

from __future__ import annotations

import math

import pytest

from gpufleet.analysis.flag_shares import serving_flag_shares
from gpufleet.analysis.serving.ledger import Surplus, serving_cells
from gpufleet.analysis.serving.measures import ServingMinute
from gpufleet.analysis.serving.slo import PRESETS
from gpufleet.serving_expo import Hist

SLO = PRESETS["mlperf-llama3.1-8b"]
TTFT = Hist((1.0, 2.0, math.inf), (80.0, 90.0, 100.0), 50.0)  # 90% within 2 s
TPOT = Hist((0.05, 0.1, math.inf), (95.0, 100.0, 100.0), 3.0)  # all within 100 ms


def _m(minute: int, **measures: float | Hist) -> ServingMinute:
    return ServingMinute("chat", "r0", minute * 60, 2, "vllm", measures)


def test_cells_carry_the_split_and_leave_unknown_to_the_telemetry() -> None:
    ms = [(_m(0, requests=100.0, ttft=TTFT, tpot=TPOT), ["g0", "g1"]),
          (_m(1, requests=0.0), None),
          (_m(2, running=1.0), ["g0", "g1"])]  # no requests, no latencies: unknown
    cells = serving_cells(ms, {"chat": SLO})
    assert [c.minute_ts for c in cells] == [0, 60]
    assert cells[0].gpu_uuids == ("g0", "g1") and cells[1].gpu_uuids == ()
    assert cells[0].seconds["productive"] == pytest.approx(108.0)
    assert cells[0].seconds["slo_missed"] == pytest.approx(12.0)
    assert cells[1].seconds == {"idle_replica": 120.0}


def test_an_overprovisioning_episode_takes_the_surplus_share_of_the_served_seconds() -> None:
    ev = {"gpus": 8, "needed_gpus": 2, "replicas": 4, "needed_replicas": 1}
    s = Surplus.of("chat", 60.0, 180.0, ev)
    assert s is not None and s.share == pytest.approx(0.75)
    assert Surplus.of("chat", 0, 60, {"gpus": 2, "needed_gpus": 2}) is None  # needs all it holds
    assert Surplus.of("chat", 0, 60, {"gpus": "x"}) is None
    ms = [(_m(j, requests=100.0, ttft=TTFT, tpot=TPOT), None) for j in range(4)]
    cells = serving_cells(ms, {"chat": SLO}, [s, Surplus("other", 0.0, 1e9, 0.5)])
    over = [c.seconds.get("overprovisioned_deployment", 0.0) for c in cells]
    assert over == pytest.approx([0.0, 108.0 * 0.75, 108.0 * 0.75, 0.0])  # minutes 1 and 2: [60, 180)
    for c in cells:  # the minute still adds up to its GPU-seconds
        assert sum(c.seconds.values()) == pytest.approx(120.0)


def test_each_serving_flag_gets_its_kinds_seconds_in_its_episode_once() -> None:
    rows = [(10, "idle_replica", 120.0), (11, "idle_replica", 120.0), (12, "idle_replica", 60.0),
            (11, "slo_missed", 30.0), (12, "productive", 60.0), (13, "overprovisioned_deployment", 90.0)]
    flags = [("idle_replica", "serving:chat:r0", 600.0, 720.0),  # minutes 10, 11
             ("idle_replica", "serving:chat", 600.0, 780.0),  # the deployment's: only minute 12 is left
             ("slo_missed", "serving:chat", 0.0, 1e9),
             ("overprovisioned_deployment", "serving:chat", 0.0, 1e9),
             ("batch_too_small", "serving:chat:r0", 0.0, 1e9),  # no category: 0
             ("hung", "progress", 0.0, 1e9)]  # not a serving scope: not here
    got = serving_flag_shares(rows, flags)
    assert got == {("idle_replica", "serving:chat:r0"): round(240 / 3600, 4),
                   ("idle_replica", "serving:chat"): round(60 / 3600, 4),
                   ("slo_missed", "serving:chat"): round(30 / 3600, 4),
                   ("overprovisioned_deployment", "serving:chat"): round(90 / 3600, 4),
                   ("batch_too_small", "serving:chat:r0"): 0.0}
