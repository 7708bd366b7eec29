"""Waste accounting adds up, for any telemetry (property tests): per GPU-window claims <= 1,
a job's waste <= its allocated GPU-hours, a fleet's waste <= the fleet's allocation, the score
a ratio in 0..1, and active GPU-hours <= allocated."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .verdict_data import GIB, run

SIGNALS = ("sm_active", "tensor_active", "dram_active", "gpu_util", "power_w", "sm_clock_mhz", "fb_used_bytes")


@st.composite
def jobs(draw: st.DrawFn) -> tuple[int, float, float, object]:
    g = draw(st.integers(1, 4))
    minutes = draw(st.floats(5, 150))
    interval = draw(st.sampled_from([1.0, 10.0, 30.0, 60.0]))
    present = draw(st.sets(st.sampled_from(SIGNALS)))
    levels = draw(st.lists(st.floats(0, 1), min_size=4, max_size=4))
    idle_from = draw(st.floats(0, 1)) * minutes * 60
    burst = draw(st.floats(2, 120))

    def fn(t: np.ndarray, gi: int) -> dict[str, np.ndarray | float]:
        on = (t < idle_from) & ((np.floor(t / burst) + gi) % 2 == 0) | (levels[3] > 0.5)
        sm = np.where(on, levels[0], 0.0)
        d: dict[str, np.ndarray | float] = {
            "sm_active": sm, "tensor_active": sm * levels[1], "dram_active": sm * levels[2],
            "gpu_util": np.where(on, 1.0, 0.0), "power_w": 100 + 500 * sm, "sm_clock_mhz": 1980.0 * (0.5 + sm / 2),
            "fb_used_bytes": 40 * GIB * levels[2], "fb_total_bytes": 80 * GIB}
        return {k: v for k, v in d.items() if k in present or k == "fb_total_bytes"}

    return g, minutes, interval, fn


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(jobs(), min_size=1, max_size=3))
def test_waste_never_exceeds_what_was_allocated(fleet: list[tuple[int, float, float, object]]) -> None:
    total_waste = total_alloc = 0.0
    for g, minutes, interval, fn in fleet:
        res = run(g, minutes, interval, fn)  # type: ignore[arg-type]
        alloc = res.allocated_gpu_hours
        assert res.wasted_gpu_hours <= alloc + 1e-6
        for f in res.findings:
            assert 0.0 <= f.wasted_gpu_hours <= alloc + 1e-6
            if f.claim.size:
                assert float(f.claim.min()) >= 0.0 and float(f.claim.max()) <= 1.0
        for kind, w in res.report["wasted_gpu_hours"].items():
            assert w <= alloc + 1e-6, kind
        assert res.goodput_score is None or 0.0 <= res.goodput_score <= 1.0
        assert (res.report["active_gpu_hours"] or 0.0) <= alloc + 1e-6
        total_waste += res.wasted_gpu_hours
        total_alloc += alloc
    assert total_waste <= total_alloc + 1e-6
