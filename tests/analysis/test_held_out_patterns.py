"""Patterns an outside evaluation found wrong (issue 36), each fixed where it comes from:
node-level InfiniBand counters are not a one-node job's own traffic; one GPU of eight idle for
the whole job is flagged with its waste; a crash loop is seen from GPU memory going back to
zero and is never taken for a serving replica."""

from __future__ import annotations

import numpy as np

from gpufleet.analysis.restarts import restarts
from gpufleet.analysis.workload import from_pattern

from .verdict_data import GIB, healthy_training, kinds, run

NDR = 5.0e10  # bytes/s per direction (thresholds.toml, H100)


def _ib_busy_low_sm(t: np.ndarray, g: int) -> dict[str, np.ndarray | float]:
    d = dict(healthy_training(t, g))
    d.update({"sm_active": 0.45, "tensor_active": 0.2, "nvlink_tx_bytes_s": 1e9, "nvlink_rx_bytes_s": 1e9,
              "ib_tx_bytes_s": 0.9 * NDR, "ib_rx_bytes_s": 0.9 * NDR})
    return d


def test_node_level_ib_is_not_a_one_node_jobs_own_traffic() -> None:
    one_node = run(4, 90, 10.0, _ib_busy_low_sm, nodes=["n1"] * 4)
    assert "comm_bound" not in kinds(one_node)
    two_nodes = run(4, 90, 10.0, _ib_busy_low_sm, nodes=["n1", "n1", "n2", "n2"])
    (f,) = [f for f in two_nodes.findings if f.kind == "comm_bound"]
    assert f.evidence["ib_util"] >= 0.85 and f.evidence["ib_attribution"].startswith("per node")


def _one_idle(idle: int):  # type: ignore[no-untyped-def]
    def fn(t: np.ndarray, g: int) -> dict[str, np.ndarray | float]:
        d = dict(healthy_training(t, g))
        if g == idle:
            d.update({"sm_active": 0.0, "tensor_active": 0.0, "dram_active": 0.0, "gpu_util": 0.0, "power_w": 70.0,
                      "sm_occupancy": 0.0, "fb_used_bytes": 0.52 * GIB, "nvlink_tx_bytes_s": 0.0,
                      "nvlink_rx_bytes_s": 0.0})
        return d
    return fn


def test_one_gpu_of_eight_idle_for_the_job_is_flagged_with_its_waste() -> None:
    res = run(8, 180, 10.0, _one_idle(5))
    (f,) = [f for f in res.findings if f.kind == "idle_gpu"]
    assert f.scope == "GPU-5" and f.evidence["gpu_uuid"] == "GPU-5" and f.evidence["idle_gpus"] == 1
    assert 2.5 < f.wasted_gpu_hours <= 3.0  # that GPU's three hours, nobody else's
    assert "oversized_allocation" not in kinds(res)
    assert f.claim[5].sum() > 0 and np.delete(f.claim, 5, axis=0).sum() == 0


def test_a_healthy_job_has_no_idle_gpu() -> None:
    assert kinds(run(8, 180, 10.0, healthy_training)) == set()


def _crash_loop(t: np.ndarray, g: int) -> dict[str, np.ndarray | float]:
    """5 min back-off with the memory released, a minute of start-up, 6 min of work, again."""
    d = dict(healthy_training(t, g))
    phase = t % 720.0
    down = phase < 300.0
    start = (phase >= 300.0) & (phase < 360.0)
    for k in ("sm_active", "tensor_active", "dram_active", "gpu_util", "sm_occupancy"):
        d[k] = np.where(down, 0.0, np.where(start, 0.05, np.broadcast_to(d[k], t.shape)))
    d["power_w"] = np.where(down, 70.0, 600.0)
    d["fb_used_bytes"] = np.where(down, 0.0, np.where(start, 2 * GIB, 60 * GIB))
    return d


def test_a_crash_loop_is_found_from_gpu_memory_and_is_not_serving() -> None:
    res = run(2, 240, 10.0, _crash_loop)
    (f,) = [f for f in res.findings if f.kind == "crash_loop"]
    assert f.evidence["restarts"] >= 15 and f.evidence["period_minutes"] == 12.0
    assert 4.0 <= f.evidence["median_backoff_minutes"] <= 6.0
    assert f.wasted_gpu_hours > 0.3 * 2 * 4  # the back-off: 5 of every 12 minutes on both GPUs
    from gpufleet.analysis.config import load_thresholds
    from gpufleet.analysis.detectors import features_for

    from .verdict_data import telemetry
    ts, gpu, cols = telemetry(2, 240, 10.0, _crash_loop)
    feats = features_for(load_thresholds(), ts, gpu, cols, 2)
    assert len(restarts(feats.f["fb_used_max"])) >= 15
    busy = np.tile(np.array([0.0, 0.0, 0.0, 0.6, 0.9, 0.9, 0.9] * 8), (2, 1))  # a swinging busy share
    assert from_pattern(busy, np.ones_like(busy, dtype=bool), feats.f["fb_used_max"]) is None


def test_one_restart_is_not_a_loop() -> None:
    def once(t: np.ndarray, g: int) -> dict[str, np.ndarray | float]:
        d = dict(healthy_training(t, g))
        d["fb_used_bytes"] = np.where((t > 3600) & (t < 3900), 0.0, 60 * GIB)
        return d
    assert "crash_loop" not in kinds(run(2, 180, 10.0, once))


def test_the_report_does_not_call_a_crash_loop_serving() -> None:
    res = run(2, 240, 10.0, _crash_loop)
    assert (res.report["workload"] or {}).get("class") != "serving", res.report["workload"]
