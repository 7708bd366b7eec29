"""The progress library through the relay's fold and the progress detectors, judged as windows
arrive (issue 36): a rank that slows 3.5x late is singled out within 3 minutes of its onset,
with its new step time and its own earlier one; the flag starts at the onset and stays there;
a hang is raised within 90 s of the last step; clean exits and an elastic resize raise nothing."""

from __future__ import annotations

import numpy as np
import pytest
from realworld.progress_library import BUILDERS
from realworld.ttd import replay


def _run(name: str, cadence: int = 10, before_onset_s: float | None = None):  # type: ignore[no-untyped-def]
    """One seed of a case; passes from ``before_onset_s`` ahead of its fault's onset (None: all)."""
    rng = np.random.default_rng([1, sum(map(ord, name))])
    c = BUILDERS[name](rng, 1)
    onset = min((t for t in c.expect.values() if t is not None), default=0.0)
    return replay(c, cadence, rng, 0.0 if before_onset_s is None else onset - before_onset_s)


def test_a_late_slowdown_of_one_rank_is_singled_out_within_3_minutes() -> None:
    res = _run("late_slowdown_one_rank", cadence=30, before_onset_s=600)
    (label,) = res.case.expect
    hits = res.hits()
    assert label in hits and hits[label] is not None and 0 < hits[label] <= 180, (hits, res.first)
    assert res.false() == []
    f = res.findings[label.partition("@")[2]]
    onset = res.case.expect[label]
    assert onset is not None and abs(f.start_ts - res.wall0 - onset) <= 20  # the onset, not a lookback's start
    ev = f.evidence
    assert ev["own_ratio"] == pytest.approx(3.5, rel=0.15) and ev["step_s"] == pytest.approx(
        3.5 * ev["own_baseline_step_s"], rel=0.15)
    assert res.starts[label.partition("@")[2]] == {f.start_ts}  # one start from the first pass to the last


def test_a_hang_is_raised_within_90_s_of_the_last_step() -> None:
    res = _run("hang_all_ranks", before_onset_s=300)
    t = res.hits().get("hung")
    assert t is not None and 0 < t <= 90, res.first
    assert res.false() == []


@pytest.mark.parametrize("name", ["clean_exits_staggered", "elastic_resize"])
def test_clean_exits_and_resizes_raise_nothing(name: str) -> None:
    res = _run(name, cadence=60)
    assert res.first == {}, res.first
