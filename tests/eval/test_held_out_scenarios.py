"""Issue 36's held-out patterns through the product's path (protocol v1 batches, the collector's
validation and write path on SQLite, the analysis runner, flags read back from the tables):
each scenario's labels are met at 10 s and 60 s sampling."""

from __future__ import annotations

from pathlib import Path

import pytest

from .test_runner import runner

HELD_OUT = ["serving_beside_ib_training", "one_gpu_idle_of_eight", "crash_loop_backoff"]


@pytest.mark.parametrize("interval", [10, 60])
def test_held_out_patterns_meet_their_labels(tmp_path: Path, interval: int) -> None:
    res = runner.run_interval(interval, HELD_OUT, [1], tmp_path)
    assert res.timing["analysis_errors"] == 0
    assert {o.scenario for o in res.outcomes} == set(HELD_OUT)
    for o in res.outcomes:
        e = o.expect
        missed = e.required - o.raised
        false = o.raised - e.ok_kinds()
        assert not missed and not false, (o.scenario, o.job_id, sorted(o.raised), o.flags)
    idle = [f for o in res.outcomes if o.scenario == "one_gpu_idle_of_eight" for f in o.flags]
    assert [f["scope"].startswith("GPU-") for f in idle if f["kind"] == "idle_gpu"] == [True]
    assert all(f["wasted_gpu_hours"] > 2.0 for f in idle if f["kind"] == "idle_gpu")
