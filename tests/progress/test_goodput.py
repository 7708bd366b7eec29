"""The goodput arithmetic on hand-made windows: restarts across processes, eval productive or
not, MFU against a peak, and the hardware cross-check of a stall (hung vs idle)."""

from __future__ import annotations

import pytest

from gpufleet.analysis.progress.detect import ProgressThresholds, detect_hung
from gpufleet.analysis.progress.goodput import job_goodput
from gpufleet.analysis.progress.model import Allocation, Window

T0 = 1_800_000_000.0


def w(k: int, pid: int = 1, first: int | None = None, steps: int = 10, start: bool = False, **kw: object) -> Window:
    first = first if first is not None else k * steps + 1
    return Window(rank=0, pid=pid, host="h", start=T0 + 10 * k, end=T0 + 10 * k + 10, steps=steps, first_step=first,
                  last_step=first + steps - 1, max_step=first + steps - 1, productive_s=kw.pop("prod", 10.0),  # type: ignore[arg-type]
                  step_hist={"-2": steps}, process_start=T0 + 10 * k if start else None, **kw)  # type: ignore[arg-type]


def test_a_restart_from_an_old_checkpoint_moves_redone_steps_to_restart_lost() -> None:
    # process 1: steps 1..60 in 60 s; process 2 starts at 30 s later from step 41 (20 redone)
    p1 = [w(k, pid=1, start=k == 0) for k in range(6)]
    p2 = [w(k, pid=2, first=41 + (k - 9) * 10, start=k == 9) for k in range(9, 15)]
    g = job_goodput(p1 + p2, Allocation(T0, T0 + 150, "allocations"))
    assert g is not None and g.restarts == 1 and g.lost_steps == 20
    assert g.badput_s["restart_lost"] == pytest.approx(20 * 1.0)
    assert g.badput_s["idle"] == pytest.approx(30.0)  # between the crash and the restart
    assert g.productive_s == pytest.approx(120 - 20)
    assert g.ettr == pytest.approx(100 / 150)


def test_eval_counts_as_productive_only_when_asked() -> None:
    ws = [w(0, start=True, prod=6.0, spans={"eval": 4.0})]
    assert job_goodput(ws).badput_s["eval"] == pytest.approx(4.0)  # type: ignore[union-attr]
    g = job_goodput(ws, eval_productive=True)
    assert g is not None and "eval" not in g.badput_s and g.productive_s == pytest.approx(10.0)


def test_mfu_from_flops_per_step_against_the_peak() -> None:
    ws = [w(0, start=True, flops_per_step=1e14)]  # 10 steps x 1e14 FLOP in 10 s = 100 TFLOP/s
    g = job_goodput(ws, peak_tflops_per_gpu=1000.0, n_gpus=1)
    assert g is not None and g.achieved_tflops == pytest.approx(100.0) and g.mfu == pytest.approx(0.1)
    assert job_goodput(ws).mfu is None  # type: ignore[union-attr]  # no GPU model: unknown


def test_a_stall_is_hung_when_the_gpus_are_busy_and_idle_when_they_are_not() -> None:
    ws = [w(0, start=True), w(1, prod=0.0, steps=0, stall_s=10.0)]
    busy = job_goodput(ws, gpu_busy=lambda a, b: True)
    idle = job_goodput(ws, gpu_busy=lambda a, b: False)
    assert busy is not None and idle is not None
    assert busy.badput_s["hung"] == pytest.approx(10.0) and busy.badput_s["idle"] == 0.0
    assert idle.badput_s["idle"] == pytest.approx(10.0) and idle.badput_s["hung"] == 0.0
    stuck = [w(0, start=True, since_step_s=0.0), w(1, steps=0, prod=0.0, since_step_s=130.0, last_step_ts=None)]
    f = detect_hung(stuck, T0 + 20, ProgressThresholds.load(), gpu_busy=True)
    assert f is not None and f.evidence["hardware"] == "busy" and f.evidence["judged_from"] == ["progress", "hardware"]
