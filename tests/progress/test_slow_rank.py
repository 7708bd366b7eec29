"""``slow_rank``'s rule on windows built here (pure): the ratio tier (>= 1.15 x the same
window's peers for a minute), the change tier (a modest, sustained rise against the rank's
own standing), and what neither flags: a rank that always runs 5-15% above its peers (stable
variation), a brief excursion of a few slow steps, a job-wide slowdown."""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable

from gpufleet.analysis.progress.detect import ProgressThresholds
from gpufleet.analysis.progress.detectors import slow_rank
from gpufleet.analysis.progress.detectors.base import ProgressContext, ProgressFinding
from gpufleet.analysis.progress.goodput import job_goodput
from gpufleet.analysis.progress.model import Window

T0 = 1_800_000_000.0
StepFn = Callable[[float], float]  # step time (s) at job time t


def windows(fns: dict[int, StepFn], until: float, seed: int = 1, jitter: float = 0.02) -> list[Window]:
    """Each rank steps at ``fns[rank](t)`` (+-``jitter``), folded into 10 s windows (p50, steps)."""
    rng = random.Random(seed)
    out = []
    for rank, fn in fns.items():
        per: dict[int, list[float]] = {}
        t = 0.0
        while True:
            d = fn(t) * rng.uniform(1 - jitter, 1 + jitter)
            t += d
            if t >= until:
                break
            per.setdefault(int(t // 10), []).append(d)
        for i, ds in sorted(per.items()):
            out.append(Window(rank=rank, pid=100 + rank, start=T0 + 10 * i, end=T0 + 10 * i + 10, host=f"h{rank}",
                              gpu="0", steps=len(ds), step_time_p50_s=statistics.median(ds), productive_s=sum(ds)))
    return out


def judge(fns: dict[int, StepFn], until: float, **kw: float) -> list[ProgressFinding]:
    th = ProgressThresholds.load()
    cfg = th.get(slow_rank.Config)
    ws = windows(fns, until, **kw)  # type: ignore[arg-type]
    g = job_goodput(ws)
    assert g is not None
    return slow_rank.detect(ProgressContext(ws, g, T0 + until, th.general), cfg)


def flat(v: float) -> StepFn:
    return lambda t: v


def test_a_rank_25_percent_slower_from_its_first_step_is_flagged_from_its_first_window() -> None:
    found = judge({**{r: flat(0.5) for r in range(4)}, 2: flat(0.625)}, 900)
    assert [f.scope for f in found] == ["progress:rank2"]
    f = found[0]
    assert f.start_ts == T0 and f.ongoing and f.evidence["ratio"] > 1.2 and f.evidence["threshold_ratio"] == 1.15


def test_a_rank_that_always_runs_10_percent_above_its_peers_is_stable_variation_not_flagged() -> None:
    # PAI job 2's pattern: the difference is there from the start and never changes.
    assert judge({**{r: flat(0.5) for r in range(8)}, 5: flat(0.55)}, 4 * 3600) == []


def test_noise_that_lifts_an_always_slower_rank_over_the_bar_is_not_flagged() -> None:
    # 10% above its peers for an hour, then 16% for five minutes: not 7% above its own standing.
    fns = {**{r: flat(0.5) for r in range(8)}, 1: lambda t: 0.5 * (1.16 if 3600 <= t < 3900 else 1.10)}
    assert judge(fns, 3900) == []


def test_a_3_5x_slowdown_late_in_a_long_run_is_flagged_within_a_minute_and_a_half_of_its_onset() -> None:
    onset = 5000.0
    fns = {**{r: flat(0.5) for r in range(10)}, 7: lambda t: 0.5 * (3.5 if t >= onset else 1.0)}
    assert judge(fns, onset + 40) == []
    found = judge(fns, onset + 90)
    assert [f.scope for f in found] == ["progress:rank7"]
    assert abs(found[0].start_ts - (T0 + onset)) <= 10
    assert found[0].evidence["own_ratio"] > 3.0


def test_a_modest_sustained_rise_against_its_own_standing_is_flagged_by_the_change_tier() -> None:
    # PAI job 3's pattern: ranks 6-9 go from ~2% under their peers to ~12% over them late in
    # the run, pulling the peers' median up with them; ranks 0-1 run 10% above all along.
    onset = 3000.0

    def fn(r: int) -> StepFn:
        if r in (0, 1):
            return flat(0.77)
        if r >= 6:
            return lambda t: 0.69 if t < onset else 0.88
        return flat(0.70)

    ranks = {r: fn(r) for r in range(10)}
    assert judge(ranks, onset + 120) == []  # the change tier asks for 3 minutes
    found = judge(ranks, onset + 400)
    assert sorted(f.scope for f in found) == [f"progress:rank{r}" for r in (6, 7, 8, 9)]
    for f in found:
        assert abs(f.start_ts - (T0 + onset)) <= 20 and f.evidence["threshold_ratio"] == 1.05
        assert 1.05 < f.evidence["ratio"] < 1.15 and f.evidence["own_ratio"] > 1.2


def test_a_job_wide_slowdown_is_no_rank_s() -> None:
    fns = {r: (lambda t: 0.5 if t < 2000 else 0.8) for r in range(8)}
    assert judge(fns, 3000) == []


def test_slow_steps_a_brief_excursion_is_not_flagged_a_sustained_straggler_is() -> None:
    # 5 s steps (1-2 a window): 20% slower for 40 steps costs the job 8 of its steps, under
    # the 20 the rule asks; 1.6x for 140 steps is a straggler.
    def fn(a: float, b: float, k: float) -> StepFn:
        return lambda t: 5.0 * (k if a <= t < b else 1.0)

    peers = {r: flat(5.0) for r in range(10)}
    assert judge({**peers, 4: fn(3000, 3200, 1.2)}, 3200, jitter=0.0) == []
    found = judge({**peers, 6: fn(3000, 4200, 1.6)}, 4000, jitter=0.0)
    assert [f.scope for f in found] == ["progress:rank6"]


def test_a_normal_minute_inside_a_slow_run_of_slow_steps_does_not_end_it() -> None:
    # 6 s steps: ten normal ones span six windows; the run is counted in steps, not windows.
    def fn(t: float) -> float:
        return 6.0 if t < 3000 or 3600 <= t < 3660 else 8.4

    found = judge({**{r: flat(6.0) for r in range(8)}, 3: fn}, 4200, jitter=0.0)
    assert [f.scope for f in found] == ["progress:rank3"]
    assert abs(found[0].start_ts - (T0 + 3000)) <= 20
