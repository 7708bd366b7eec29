"""The straggler's fast path (analysis/detectors/straggler.py), judged on the per-minute features:
a GPU or node whose busy clock falls with a slowing reason set while its peers wait for it is
raised within 3 minutes of the onset; each part of that picture missing keeps it off the fast
path (the windowed 15-minute rule, or no straggler at all)."""

from __future__ import annotations

import numpy as np
import pytest

from gpufleet.analysis.report import JobAnalysis

from .verdict_data import T0, healthy_training, run

ONSET_MIN = 30.0


def slow_gpu(bad: set[int], *, onset: float = ONSET_MIN, clock: float = 1580.0, reasons: float = float(0x8),
             busy_sm: float = 0.93, peers_sm: float = 0.70, until: float | None = None):  # type: ignore[no-untyped-def]
    """From minute ``onset`` (to ``until``), GPUs ``bad`` run at ``clock`` with ``reasons`` and SM
    ``busy_sm``; the others at ``peers_sm`` (waiting for them in the collective)."""
    def fn(t: np.ndarray, g: int) -> dict[str, np.ndarray | float]:
        d = dict(healthy_training(t, g))
        on = (t >= onset * 60) & (t < (until if until is not None else 1e9) * 60)
        if g in bad:
            d["sm_clock_mhz"] = np.where(on, clock, 1980.0)
            d["clock_event_reasons"] = np.where(on, reasons, 0.0)
            d["sm_active"] = np.where(on, busy_sm, d["sm_active"])
        else:
            d["sm_active"] = np.where(on, peers_sm, d["sm_active"])
        return d
    return fn


def first_raised(fn, n: int = 8, nodes: list[str] | None = None, horizon: int = 12,  # type: ignore[no-untyped-def]
                 onset: float = ONSET_MIN) -> tuple[float | None, JobAnalysis | None]:
    """Seconds from the onset to the first pass (one a minute, on the samples so far) with an
    ongoing straggler, and that pass's analysis."""
    for m in range(1, horizon + 1):
        res = run(n, onset + horizon + 1, 10.0, fn, until_min=onset + m, running=True, nodes=nodes)
        if any(f.kind == "straggler" and f.ongoing for f in res.findings):
            return m * 60.0, res
    return None, None


@pytest.mark.parametrize("offset", [0.0, 0.5, 0.9])
def test_slow_gpu_with_a_slowing_reason_whose_peers_wait_is_raised_within_3_minutes(offset: float) -> None:
    onset = ONSET_MIN + offset
    ttd, res = first_raised(slow_gpu({2}, onset=onset), onset=onset)
    assert ttd is not None and ttd <= 180.0
    assert res is not None
    (f,) = [f for f in res.findings if f.kind == "straggler"]
    assert f.scope == "GPU-2" and f.evidence["level"] == "gpu"
    assert f.evidence["fast_minutes"] >= 3 and f.evidence["slowing_reasons"] == ["hw_slowdown"]
    assert {"clock_deficit", "throttle_reasons"} <= set(f.evidence["signature"])
    # the onset is the first minute of the picture, not the start of its 5-minute window
    assert T0 + onset * 60 - 60 <= f.start_ts <= T0 + onset * 60 + 60


@pytest.mark.parametrize("reasons", [float(0x20), float(0x40 | 0x20), float(0x80 | 0x8)])
def test_thermal_and_power_brake_are_slowing_reasons(reasons: float) -> None:
    ttd, _ = first_raised(slow_gpu({5}, reasons=reasons))
    assert ttd is not None and ttd <= 180.0


@pytest.mark.parametrize("case", ["power_cap_only", "no_reason", "peers_do_not_wait", "equal_clock_busier"])
def test_an_incomplete_picture_stays_off_the_fast_path(case: str) -> None:
    fn = {"power_cap_only": slow_gpu({1}, reasons=float(0x4)),  # a busy H100's normal state
          "no_reason": slow_gpu({1}, reasons=0.0),
          "peers_do_not_wait": slow_gpu({1}, busy_sm=0.88, peers_sm=0.88),  # throttled, nobody held back
          "equal_clock_busier": slow_gpu({1}, clock=1980.0, reasons=0.0)}[case]  # a pipeline stage
    ttd, _ = first_raised(fn, horizon=10)
    assert ttd is None


def test_a_two_minute_dip_is_not_a_straggler() -> None:
    res = run(8, 60, 10.0, slow_gpu({3}, until=ONSET_MIN + 1.5))
    assert not [f for f in res.findings if f.kind == "straggler"]


def test_a_slow_node_is_one_node_straggler() -> None:
    nodes = ["n1"] * 4 + ["n2"] * 4 + ["n3"] * 4
    ttd, res = first_raised(slow_gpu({4, 5, 6, 7}, clock=1150.0, reasons=float(0x80 | 0x8), peers_sm=0.55),
                            n=12, nodes=nodes)
    assert ttd is not None and ttd <= 180.0 and res is not None
    (f,) = [f for f in res.findings if f.kind == "straggler"]
    assert f.scope == "n2" and f.evidence["level"] == "node" and "hw_power_brake" in f.evidence["slowing_reasons"]


def test_the_windowed_path_keeps_the_fast_paths_flag_and_onset() -> None:
    """Once the 15-minute rule finds the same GPU, one flag: the fast path's onset stays its start."""
    fn = slow_gpu({2})
    _, early = first_raised(fn)
    assert early is not None
    late = run(8, ONSET_MIN + 60, 10.0, fn, until_min=ONSET_MIN + 45, running=True)
    (a,) = [f for f in early.findings if f.kind == "straggler"]
    (b,) = [f for f in late.findings if f.kind == "straggler"]
    assert (a.scope, a.start_ts) == (b.scope, b.start_ts) and b.ongoing
    assert b.wasted_gpu_hours > a.wasted_gpu_hours > 0


def test_a_straggler_that_recovered_is_no_longer_ongoing() -> None:
    res = run(8, ONSET_MIN + 20, 10.0, slow_gpu({4}, until=ONSET_MIN + 8), until_min=ONSET_MIN + 14, running=True)
    (f,) = [f for f in res.findings if f.kind == "straggler"]
    assert f.scope == "GPU-4" and not f.ongoing and f.evidence["fast_minutes"] >= 7
