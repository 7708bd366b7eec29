"""Verdicts that hold on real fleets (issue 13): unknown is not zero, hangs are told from
checkpoints, memory-bound and FP64 work keeps its tensor cores unflagged, memory is judged
against the device's own size, low duty is seen at any sampling interval."""

from __future__ import annotations

import numpy as np
import pytest

from .verdict_data import GIB, healthy_training, kinds, run


def util_only(util: float, power: float):  # type: ignore[no-untyped-def]
    """Imported history or an old driver: NVML utilisation, power and memory, no profiling."""
    return lambda t, g: {"gpu_util": util, "power_w": power, "fb_used_bytes": 30 * GIB, "fb_total_bytes": 80 * GIB}


@pytest.mark.parametrize("interval", [1.0, 60.0])
def test_busy_gpus_without_profiling_are_not_idle(interval: float) -> None:
    res = run(8, 90, interval, util_only(1.0, 550.0))
    assert res.findings == []
    assert res.goodput_score is not None and res.goodput_score > 0.9
    assert any("profiling metrics missing on 8/8 GPUs: judged from gpu_util and power" in n
               for n in res.report["notes"])
    assert res.report["coverage"]["sm_active"] == 0 and res.report["coverage"]["gpu_util"] == 8
    # the detectors that need profiling metrics said they abstained, and why
    ab = res.report["abstained"]
    assert ab["no_tensor_cores"] == "needs sm_active, tensor_active" and ab["hung"] == "needs sm_active"
    assert "idle_gpu" not in ab and "memory_underuse" not in ab  # they fall back to gpu_util


@pytest.mark.parametrize("interval", [1.0, 60.0])
def test_idle_gpus_without_profiling_flag_with_medium_confidence(interval: float) -> None:
    res = run(2, 90, interval, util_only(0.0, 70.0))
    (f,) = res.findings
    assert f.kind == "idle_gpu"
    assert f.evidence["confidence"] == "medium" and f.evidence["judged_from"][0] == "gpu_util"
    assert f.evidence["sm_active_max"] is None and f.evidence["gpu_util_max"] == 0.0
    # the claim never exceeds the time observed, nor the allocation
    assert f.wasted_gpu_hours <= res.allocated_gpu_hours + 1e-9
    assert res.wasted_gpu_hours <= res.allocated_gpu_hours + 1e-9


def test_a_job_shorter_than_one_window_is_too_short_not_missing_metrics() -> None:
    """A real 93 s training job on an H200 had every profiling metric, yet its report said
    "profiling metrics missing on 1/1 GPUs": no 5-minute window was covered enough to judge."""
    res = run(1, 1.5, 1.0, healthy_training)
    assert res.findings == []
    notes = res.report["notes"]
    assert not any("profiling metrics missing" in n for n in notes), notes
    assert any("too short to judge" in n for n in notes), notes
    longer = run(1, 90, 1.0, healthy_training)
    assert not any("too short" in n for n in longer.report["notes"])


def test_no_activity_signal_no_flag() -> None:
    """Rows with memory only: nothing says whether a kernel ran, so nothing is concluded."""
    res = run(2, 120, 10.0, lambda t, g: {"fb_used_bytes": 1 * GIB, "fb_total_bytes": 80 * GIB})
    assert res.findings == [] and res.goodput_score is None
    assert any("nothing judged" in n for n in res.report["notes"])


def hang_after(minute: float, until: float | None = None):  # type: ignore[no-untyped-def]
    """Training, then from ``minute`` (to ``until``) a collective that never completes: NVML
    sees a resident kernel, SMs nearly empty, no tensor, DRAM or link traffic."""
    def fn(t: np.ndarray, g: int) -> dict[str, np.ndarray | float]:
        d = dict(healthy_training(t, g))
        stuck = (t >= minute * 60) & (t < (until if until is not None else 1e9) * 60)
        for k, v in (("sm_active", 0.15), ("tensor_active", 0.0), ("dram_active", 0.002), ("sm_occupancy", 0.02),
                     ("nvlink_tx_bytes_s", 0.0), ("nvlink_rx_bytes_s", 0.0), ("power_w", 160.0)):
            d[k] = np.where(stuck, v, np.broadcast_to(d[k], t.shape))
        return d
    return fn


@pytest.mark.parametrize("interval", [1.0, 10.0, 30.0, 60.0])
def test_hang_raised_within_15_minutes(interval: float) -> None:
    for start in (37.0, 40.5):  # any alignment with the 5-minute windows
        res = run(8, 240, interval, hang_after(start), until_min=start + 15, running=True)
        assert "hung" in kinds(res), (interval, start, kinds(res))
        assert "low_sm_activity" not in kinds(res)
        (f,) = [f for f in res.findings if f.kind == "hung"]
        assert f.ongoing and f.evidence["gpu_util"] >= 0.9 and f.evidence["confidence"] == "high"
        assert "py-spy" in f.suggestion
    res = run(8, 240, interval, hang_after(40.0))
    (f,) = [f for f in res.findings if f.kind == "hung"]
    assert f.severity == "critical" and f.evidence["hung_minutes"] >= 190
    assert kinds(res) == {"hung"}


def checkpoint_after(minute: float, until: float):  # type: ignore[no-untyped-def]
    """Rank 0 writes a checkpoint (its GPU copies to the host: PCIe busy, no kernel resident)
    while the other ranks spin in the barrier with the hang's signature."""
    spin = hang_after(minute, until)

    def fn(t: np.ndarray, g: int) -> dict[str, np.ndarray | float]:
        if g != 0:
            return spin(t, g)
        d = dict(healthy_training(t, g))
        on = (t >= minute * 60) & (t < until * 60)
        for k, v in (("sm_active", 0.015), ("tensor_active", 0.0), ("dram_active", 0.06), ("gpu_util", 0.10),
                     ("sm_occupancy", 0.01), ("nvlink_tx_bytes_s", 0.0), ("nvlink_rx_bytes_s", 0.0),
                     ("power_w", 150.0)):
            d[k] = np.where(on, v, np.broadcast_to(d[k], t.shape))
        return d
    return fn


@pytest.mark.parametrize("start", [30.0, 32.5, 34.0])
def test_ten_minute_checkpoint_is_not_a_hang(start: float) -> None:
    res = run(8, 120, 1.0, checkpoint_after(start, until=start + 10))
    assert res.findings == []


@pytest.mark.parametrize("start", [30.0, 32.5, 34.0])
def test_every_gpu_spinning_for_minutes_is_a_hang_within_5_minutes(start: float) -> None:
    """Every GPU of the job resident and empty means every rank waits in a collective for a
    peer that is in none: a hang. (Issue 36: the hardware alone raises it within 5 minutes;
    before, the 12-minute rule for a share of the GPUs applied here too, and this test's
    predecessor labelled a 10-minute pause of every GPU a checkpoint: that label changed.)"""
    res = run(8, start + 5, 1.0, hang_after(start), running=True)
    assert "hung" in kinds(res), kinds(res)


def test_hang_needs_profiling_metrics() -> None:
    """Utilisation pinned at 100% with no profiling metrics is full use as far as anyone can tell."""
    assert run(8, 120, 10.0, util_only(1.0, 160.0)).findings == []


def compute(**over: float):  # type: ignore[no-untyped-def]
    def fn(t: np.ndarray, g: int) -> dict[str, np.ndarray | float]:
        d = dict(healthy_training(t, g))
        d.update(over)
        return d
    return fn


def test_tensor_cores_only_where_they_would_help() -> None:
    # FP32 GEMMs, compute-bound: the flag is right.
    assert "no_tensor_cores" in kinds(run(2, 60, 1.0, compute(tensor_active=0.0, fp32_active=0.6, dram_active=0.3)))
    # Memory-bound (DRAM ~85%, no matrix math): tensor cores would not help.
    assert kinds(run(2, 60, 1.0, compute(tensor_active=0.0, fp32_active=0.2, dram_active=0.85))) == set()
    # Sparse FP64 solver: FP64 pipes at 5-8%.
    assert kinds(run(2, 60, 1.0, compute(tensor_active=0.0, fp32_active=0.1, fp64_active=0.06,
                                         dram_active=0.45))) == set()


def test_memory_judged_against_the_devices_total() -> None:
    small = {"sm_active": 0.12, "tensor_active": 0.03, "gpu_util": 0.6, "dram_active": 0.1}
    # A MIG 1g.10gb slice using 8 of 9.8 GiB: well used memory, not "move to a MIG slice".
    mig = run(1, 60, 1.0, compute(fb_used_bytes=8 * GIB, fb_total_bytes=9.8 * GIB, **small), model="NVIDIA H100 80GB "
              "HBM3 MIG 1g.10gb")
    assert "memory_underuse" not in kinds(mig)
    # The same 8 GiB on a whole 80 GB H100 is a tiny workload on a big GPU.
    assert "memory_underuse" in kinds(run(1, 60, 1.0, compute(fb_used_bytes=8 * GIB, **small)))


@pytest.mark.parametrize("interval", [1.0, 15.0, 30.0, 60.0])
def test_bursty_low_duty_seen_at_any_interval(interval: float) -> None:
    """~10% SM on average, in bursts: sampled every 15 s the old rule saw nothing."""
    def fn(t: np.ndarray, g: int) -> dict[str, np.ndarray | float]:
        d = dict(healthy_training(t, g))
        burst = (np.floor(t / 40.0) % 5) == 0  # 8 s of every 40 s busy
        d["sm_active"] = np.where(burst, 0.5, 0.0)
        d["tensor_active"] = np.where(burst, 0.2, 0.0)
        d["gpu_util"] = np.where(burst, 1.0, 0.0)
        return d
    got = kinds(run(2, 90, interval, fn))
    assert got & {"low_sm_activity", "input_stall"}, got


def test_low_confidence_flags_never_page() -> None:
    from gpufleet.alerts.config import AlertConfig
    from gpufleet.alerts.decide import alerting_kinds
    from gpufleet.alerts.facts import FlagFact, JobFacts

    def facts(conf: str) -> JobFacts:
        return JobFacts(job_pk=1, cluster="c", job_id="1", user="u", name="n", account="a", partition="p",
                        state="running", start_ts=0.0, n_gpus=8, nodes=("n1",), gpu_models=("H100",),
                        goodput_score=0.1, allocated_gpu_hours=80.0, wasted_gpu_hours_total=40.0,
                        flags=(FlagFact("idle_gpu", "", "critical", 40.0, {"confidence": conf}, "s"),))

    cfg = AlertConfig(default_webhook="http://x")
    assert set(alerting_kinds(facts("medium"), cfg, now=36000.0)) == {"idle_gpu"}
    assert alerting_kinds(facts("low"), cfg, now=36000.0) == {}


def stages(busy_rows: set[int], *, clock: float = 1980.0, reasons: float = 0.0):  # type: ignore[no-untyped-def]
    """8 GPUs; ``busy_rows`` run harder (the heaviest pipeline stage, or a slow rank)."""
    def fn(t: np.ndarray, g: int) -> dict[str, np.ndarray | float]:
        d = dict(healthy_training(t, g))
        if g in busy_rows:
            d.update(sm_active=0.92, sm_clock_mhz=clock, clock_event_reasons=reasons)
        else:
            d.update(sm_active=0.62, tensor_active=0.3)
        return d
    return fn


def test_busier_stage_at_equal_clocks_is_pipeline_imbalance_not_a_straggler() -> None:
    res = run(8, 60, 1.0, stages({0, 1}))
    assert "straggler" not in kinds(res)
    (f,) = [f for f in res.findings if f.kind == "pipeline_imbalance"]
    assert "drain" not in f.suggestion and f.evidence["sm_active_busiest"] > f.evidence["sm_active_others"]


def test_clock_deficit_with_throttle_reasons_is_a_straggler() -> None:
    res = run(8, 60, 1.0, stages({3}, clock=1500.0, reasons=float(0x40 | 0x8)))
    (f,) = [f for f in res.findings if f.kind == "straggler"]
    assert f.scope == "GPU-3" and "clock_deficit" in f.evidence["signature"]
    assert "throttle_reasons" in f.evidence["signature"]
    assert "pipeline_imbalance" not in kinds(res)


def test_input_stall_evidence_is_measured() -> None:
    """A training job whose GPUs alternate: 3 s of full SMs, 3 s waiting for the next batch."""
    def fn(t: np.ndarray, g: int) -> dict[str, np.ndarray | float]:
        d = dict(healthy_training(t, g))
        busy = (np.floor(t / 3.0) % 2) == 0
        d.update(sm_active=np.where(busy, 0.85, 0.0), tensor_active=np.where(busy, 0.4, 0.0),
                 gpu_util=np.where(busy, 1.0, 0.0), pcie_rx_bytes_s=np.where(busy, 1e9, 6e9))
        return d
    (f,) = run(2, 60, 1.0, fn).findings
    assert f.kind == "input_stall"
    assert 1e9 <= f.evidence["pcie_rx_bytes_s"] <= 6e9
    assert all(not isinstance(v, str) or k in ("confidence",) for k, v in f.evidence.items())
