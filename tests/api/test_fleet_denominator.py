"""The fleet's waste has a denominator: GPU-hours allocated to jobs inside the window, open
allocations running to now, ended ones only for their part inside the window."""

from __future__ import annotations

import httpx
import pytest
from apiseed import Seeded


def test_allocated_gpu_hours_is_the_waste_denominator(api: tuple[httpx.Client, Seeded]) -> None:
    c, s = api
    f = c.get("/api/v1/fleet/summary", params={"window": "24h"}).json()
    run = s.now - s.start  # the seed: 4 + 2 GPUs since start, 1 GPU for 30 min, 1 GPU since start + 10 min
    expected = (6 * run + 1800 + (run - 600)) / 3600
    assert f["allocated_gpu_hours"] == pytest.approx(expected, rel=0.01)
    assert f["wasted_gpu_hours_total"] < f["allocated_gpu_hours"]
    # 30 minutes: the ended job is outside; the 7 open allocations count half an hour each
    short = c.get("/api/v1/fleet/summary", params={"window": "30m"}).json()
    assert short["allocated_gpu_hours"] == pytest.approx(7 * 0.5, rel=0.01)
    other = c.get("/api/v1/fleet/summary", params={"window": "24h", "cluster": "nope"}).json()
    assert other["allocated_gpu_hours"] == 0
