"""The pure heuristics on simulated jobs: every profile gets exactly its ground-truth flags,
short blips never flag, the report carries the contract's fields, incremental equals full."""

from __future__ import annotations

import numpy as np
import pytest
from simjobs import analyze_data, generate, meta_of

from gpufleet.agent.simulator import PROFILES, make_job
from gpufleet.analysis.config import FLAG_KINDS, load_thresholds
from gpufleet.analysis.detectors import features_for, idle_gpu
from gpufleet.analysis.features import hist_quantile, histograms, minute_features
from gpufleet.analysis.report import MFU_BASIS, analyze

from .conftest import T0

# Smallest realistic size per profile keeps this fast (multi-node ones need two nodes).
SIZE = {"llm_pretrain": 8, "multinode_dp": 16, "comm_bound": 16, "straggler": 8, "hw_fault": 8,
        "oversized_allocation": 4, "hung": 8, "pipeline_imbalance": 8}


def _job(profile: str, minutes: float = 42, n: int | None = None, jid: str | None = None):  # type: ignore[no-untyped-def]
    n = n or SIZE.get(profile, 2)
    return make_job(profile, jid or f"t-{profile}", n, T0 + 17.25, minutes * 60)


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_every_profile_gets_exactly_its_flags(profile: str) -> None:
    res = analyze_data(generate(_job(profile)))
    got = {f.kind for f in res.findings}
    assert got == set(PROFILES[profile].flags), [(f.kind, f.scope, f.evidence) for f in res.findings]
    for f in res.findings:
        assert f.kind in FLAG_KINDS
        assert f.severity in ("info", "warning", "critical")
        assert f.suggestion and "\n" not in f.suggestion
        assert f.evidence and f.start_ts <= f.end_ts
        assert f.wasted_gpu_hours >= 0


def test_report_contract() -> None:
    d = generate(_job("input_stall", n=2))
    r = analyze_data(d).report
    for k in ("window", "n_gpus", "gpu_model", "allocated_gpu_hours", "active_gpu_hours", "goodput_score", "stats",
              "mfu", "wasted_gpu_hours", "wasted_gpu_hours_total", "per_gpu"):
        assert k in r, k
    assert set(r["window"]) >= {"start", "end"}
    for s in ("sm_active", "sm_occupancy", "tensor_active", "dram_active"):
        assert set(r["stats"][s]) == {"mean", "p50", "p95"}
    assert r["mfu"]["basis"] == MFU_BASIS
    assert 0 <= r["mfu"]["estimate"] <= 1 and r["mfu"]["peak_tflops"] == 989.0 * 2
    assert r["n_gpus"] == 2 and abs(r["allocated_gpu_hours"] - 2 * 42 / 60) < 0.01
    assert 0 <= r["goodput_score"] <= 1
    assert r["wasted_gpu_hours"]["input_stall"] > 0
    assert r["wasted_gpu_hours_total"] <= r["allocated_gpu_hours"]
    g = r["per_gpu"][0]
    for k in ("gpu_uuid", "node", "index", "sm_active_mean", "tensor_active_mean", "dram_active_mean", "power_w_mean",
              "sm_clock_mhz_mean", "fb_used_bytes_max"):
        assert k in g
    # The histogram percentiles agree with numpy's to a percentage point.
    sm = d.cols["sm_active"]
    assert abs(r["stats"]["sm_active"]["p50"] - np.percentile(sm, 50)) <= 0.011
    assert abs(r["stats"]["sm_active"]["p95"] - np.percentile(sm, 95)) <= 0.011


def test_short_blips_never_flag() -> None:
    """A healthy job idle for 12 minutes in the middle (a stuck dataloader worker restart) and
    with a 10-minute low-activity evaluation: under every minimum duration, no flag."""
    d = generate(_job("vision_train", minutes=60, n=4))
    t = d.ts - d.ts.min()
    idle = (t > 1200) & (t < 1920)
    low = (t > 2400) & (t < 3000)
    d.cols["sm_active"][idle] = 0.0
    d.cols["sm_active"][low] = 0.3
    d.cols["tensor_active"][idle | low] = 0.0
    assert analyze_data(d).findings == []


def test_thresholds_file_overrides(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    p = tmp_path / "t.toml"
    p.write_text("[idle_gpu]\nmin_duration_s = 7200\n")
    th = load_thresholds(str(p))
    assert th.get(idle_gpu.Config).min_duration_s == 7200
    assert th.get(idle_gpu.Config).critical_after_s == 7200  # untouched keys keep the defaults
    d = generate(_job("idle_gpu", n=1))
    assert analyze_data(d, th).findings == []
    assert {f.kind for f in analyze_data(d).findings} == {"idle_gpu"}


def test_incremental_features_equal_full() -> None:
    d = generate(_job("input_stall", minutes=20, n=2))
    th = load_thresholds()
    full = minute_features(d.ts, d.gpu, d.cols, 2)
    cut = float(np.floor((d.ts.min() + 600) / 60) * 60)
    a = d.ts < cut
    part1 = minute_features(d.ts[a], d.gpu[a], {k: v[a] for k, v in d.cols.items()}, 2)
    part2 = minute_features(d.ts[~a], d.gpu[~a], {k: v[~a] for k, v in d.cols.items()}, 2)
    merged = part1.before(int(cut // 60)).extend(part2)
    assert merged.b0 == full.b0 and merged.shape == full.shape
    np.testing.assert_array_equal(merged.n, full.n)
    for k in full.f:
        np.testing.assert_allclose(merged.f[k], full.f[k], equal_nan=True, rtol=1e-12, err_msg=k)
    r1 = analyze(meta_of(d.job), full, histograms(d.cols), th=th)
    r2 = analyze(meta_of(d.job), merged, histograms(d.cols), th=th)
    assert r1.report == r2.report


def test_hist_quantile() -> None:
    rng = np.random.default_rng(1)
    x = rng.beta(2, 5, 100_000)
    h = histograms({"sm_active": x})["sm_active"]
    for q in (0.05, 0.5, 0.95):
        assert abs(hist_quantile(h, q) - np.quantile(x, q)) < 0.01  # type: ignore[operator]
    assert hist_quantile(np.zeros(100, dtype=np.int64), 0.5) is None


def test_missing_fields_are_tolerated() -> None:
    """A source without profiling metrics (old driver, no GPM): no crash, no invented flags."""
    d = generate(_job("vision_train", n=2, minutes=35))
    for k in ("tensor_active", "sm_occupancy", "dram_active", "clock_event_reasons", "nvlink_tx_bytes_s",
              "nvlink_rx_bytes_s", "ib_tx_bytes_s", "ib_rx_bytes_s", "xid_last"):
        d.cols[k] = np.full_like(d.cols[k], np.nan)
    res = analyze_data(d)
    assert res.findings == []
    assert res.report["mfu"]["estimate"] is None


def test_straggler_node_scope_and_peers_wait() -> None:
    """Half of a 2-node job on a slow node: the leave-node-out reference names the node."""
    d = generate(_job("llm_pretrain", n=16, minutes=40, jid="t-slow-node"))
    slow = d.gpu >= 8  # ranks 8..15 are the second node
    d.cols["sm_clock_mhz"] = np.where(slow & (d.cols["sm_active"] > 0.1), 1300.0, d.cols["sm_clock_mhz"])
    d.cols["clock_event_reasons"] = np.where(slow, 0x40 | 0x8, 0.0)
    d.cols["sm_active"] = np.where(slow, d.cols["sm_active"], d.cols["sm_active"] * 0.66)
    res = analyze_data(d)
    (f,) = res.findings
    assert f.kind == "straggler" and f.scope == d.job.gpus[8][0]
    assert f.evidence["level"] == "node" and len(f.evidence["gpus"]) == 8
    assert 0.25 < f.evidence["peers_wait_fraction"] < 0.45
    assert f.wasted_gpu_hours > 0


def test_hw_fault_from_agent_events_only() -> None:
    """An XID the agent saw as an event (not in the sampled xid_last) still flags the node;
    application XIDs (13, 31, 43) do not."""
    d = generate(_job("vision_train", n=2, minutes=35))
    th = load_thresholds()
    feats = features_for(th, d.ts, d.gpu, d.cols, 2)
    t = float(d.ts.min()) + 600
    res = analyze(meta_of(d.job), feats, histograms(d.cols), th=th, events=[(t, 1, "xid", 13), (t, 0, "xid", 31)])
    assert res.findings == []
    res = analyze(meta_of(d.job), feats, histograms(d.cols), th=th, events=[(t, 1, "xid", 79)])
    (f,) = res.findings
    assert f.kind == "hw_fault" and f.scope == d.job.gpus[1][0] and f.severity == "critical"
    assert f.evidence["gpus"][0]["xid"] == 79 and f.start_ts == t


def test_invalid_thresholds_are_rejected(tmp_path) -> None:  # type: ignore[no-untyped-def]
    p = tmp_path / "bad.toml"
    p.write_text('[throttled]\nseverity = "loud"\n')
    with pytest.raises(ValueError, match="severity"):
        load_thresholds(str(p))


def test_state_cache_is_bounded_in_bytes() -> None:
    from gpufleet.analysis.features import MinuteFeatures
    from gpufleet.analysis.state import JobState, StateCache

    c = StateCache(max_jobs=100, max_bytes=300_000)  # ~3 states of 92 kB
    for pk in range(10):
        f = MinuteFeatures.empty(8)
        f.n = np.zeros((8, 1440))
        st = JobState(gpu_pks=list(range(8)), feats=f)
        c.put(("db", pk), st)
    assert c.nbytes() <= 300_000 and len(c) == 3
    assert c.get(("db", 9)) is not None and c.get(("db", 0)) is None
