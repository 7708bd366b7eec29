"""The real-world scenario library itself: enough kinds, consistent labels with reasons,
deterministic generators, values a real collector accepts, counters that count, and every
pattern issue 13 names covered. (Scoring the engine is bench/realworld/run.py's job.)"""

from __future__ import annotations

import numpy as np
import pytest
from realworld.library import REGISTRY
from realworld.model import INTERVALS, KINDS, PIPELINE_KINDS, REPLICA_KINDS, instantiate
from realworld.render import FIELD_SETS, render

from gpufleet.catalog import CATALOG

KNOWN = set(KINDS) | PIPELINE_KINDS | REPLICA_KINDS
COUNTERS = ("energy_j", "ecc_dbe_volatile", "ecc_sbe_volatile", "nvlink_error_count", "pcie_replay_count")


def _jobs(name: str, seed: int = 1):
    return instantiate(REGISTRY[name], seed)


def test_at_least_25_kinds_each_with_a_why_and_a_source():
    assert len(REGISTRY) >= 25
    for name, sc in REGISTRY.items():
        assert len(sc.why.split()) >= 12 and sc.why.rstrip().endswith((".", ")")), name
        assert len(sc.doc.split()) >= 15, f"{name}: the docstring must say what makes it true to life"
        assert sc.seeds and sc.intervals, name


def test_every_flag_kind_has_a_true_positive_and_healthy_jobs_are_plentiful():
    required = set()
    for sc in REGISTRY.values():
        required |= sc.requires
    assert set(KINDS) <= required, f"no scenario requires {set(KINDS) - required}"
    assert sum(sc.healthy for sc in REGISTRY.values()) >= 15


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_labels_are_consistent(name: str):
    sc = REGISTRY[name]
    demanded_anywhere = set()
    for spec in _jobs(name):
        assert spec.why and spec.slots and len(spec.slots) == len(spec.truths)
        for iv in sc.intervals:
            e = spec.expect(iv)
            assert e.required <= KNOWN and e.allowed <= KNOWN, (name, iv)
            assert not (e.required & e.allowed), f"{name}: a kind both required and allowed"
            for g in e.any_of:
                assert g and set(g) <= KNOWN
            for kind, at in e.deadline_s:
                assert kind in e.expected() and 0 < at <= spec.duration_s
            demanded_anywhere |= e.required | {g[0] for g in e.any_of}
    # The scenario's summary names what some job of it demands at some interval.
    assert sc.requires <= demanded_anywhere | {k for s in _jobs(name) for iv in sc.intervals
                                               for g in s.expect(iv).any_of for k in g}, name


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_generators_are_deterministic_and_seeds_differ(name: str):
    a, b = _jobs(name, 1), _jobs(name, 1)
    c = _jobs(name, 2)
    assert [j.job_id for j in a] == [j.job_id for j in b]
    assert [j.job_id for j in a] != [j.job_id for j in c]
    for ja, jb in zip(a, b, strict=True):
        for ga, gb in zip(ja.truths, jb.truths, strict=True):
            for k in ga.act:
                np.testing.assert_array_equal(ga.act[k], gb.act[k])
            np.testing.assert_array_equal(ga.fb_used, gb.fb_used)
    ra = render(a[0].truths[0], t0=0, interval_s=10, field_set=a[0].field_set, rng=np.random.default_rng(5))
    rb = render(b[0].truths[0], t0=0, interval_s=10, field_set=b[0].field_set, rng=np.random.default_rng(5))
    np.testing.assert_array_equal(ra.ts, rb.ts)
    for f in ra.cols:
        np.testing.assert_array_equal(ra.cols[f], rb.cols[f])


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_rendered_values_are_in_catalog_units_and_ranges(name: str):
    sc = REGISTRY[name]
    iv = 10 if 10 in sc.intervals else sc.intervals[0]
    for spec in _jobs(name):
        for s, g in zip(spec.slots, spec.truths, strict=True):
            r = render(g, t0=1.79e9, interval_s=iv, field_set=spec.field_set, rng=np.random.default_rng(1),
                       gaps=spec.gaps.get(s.node, []), profiling_paused=spec.profiling_paused)
            assert set(r.cols) <= set(FIELD_SETS[spec.field_set]) <= set(CATALOG.names)
            assert r.ts.size and np.all(np.diff(r.ts) > 0)
            for f, v in r.cols.items():
                fld = CATALOG[f]
                ok = v[~np.isnan(v)]
                assert np.all(np.isfinite(ok)), (name, f)
                assert ok.size == 0 or (ok.min() >= fld.min and ok.max() <= fld.max), (name, f, ok.min(), ok.max())
                if fld.unit == "ratio":
                    assert ok.size == 0 or ok.max() <= 1.0
            for f in COUNTERS:
                if f in r.cols:
                    v = r.cols[f]
                    assert np.all(np.diff(v[~np.isnan(v)]) >= 0), f"{name}: counter {f} went backwards"
            if "fb_used_bytes" in r.cols and "fb_total_bytes" in r.cols:
                assert np.all(r.cols["fb_used_bytes"] <= r.cols["fb_total_bytes"])


def test_job_ids_are_unique_across_the_library():
    seen: dict[str, str] = {}
    for name, sc in REGISTRY.items():
        for seed in sc.seeds:
            for spec in instantiate(sc, seed):
                assert spec.job_id not in seen, f"{spec.job_id}: {name}/{seed} and {seen[spec.job_id]}"
                seen[spec.job_id] = f"{name}/{seed}"


def test_issue_13_patterns_are_covered():
    must = {"nvml_only_busy", "nvml_only_idle", "imported_inference_pods", "memory_bound_etl", "fp64_sparse_hpc",
            "serving_bursty", "serving_diurnal", "mig_slice_inference", "pipeline_stage_imbalance", "bursty_low_duty",
            "hung_collective", "checkpoint_10min_barrier", "agent_restart_gaps", "late_start_staging",
            "notebook_left_open", "shared_node_neighbours", "fp64_dense_hpc", "comm_heavy_fsdp",
            "compile_warmup_long", "eval_heavy_finetune"}
    assert must <= set(REGISTRY)
    assert 15 in REGISTRY["bursty_low_duty"].intervals
    assert all(iv in REGISTRY["llm_pretrain_multinode"].intervals for iv in INTERVALS)


def test_nvml_only_and_imported_fleets_carry_no_profiling_fields():
    for spec in _jobs("nvml_only_busy"):
        r = render(spec.truths[0], t0=0, interval_s=1, field_set=spec.field_set, rng=np.random.default_rng(0))
        assert "sm_active" not in r.cols and "tensor_active" not in r.cols
        busy = r.cols["gpu_util"] > 0.9
        assert busy.mean() > 0.8 and np.median(r.cols["power_w"][busy]) > 450  # busy at ~100% and 450+ W
    pods = _jobs("imported_inference_pods")
    assert all(p.path == "ndjson" and p.field_set == "util_fb" for p in pods)
    assert REGISTRY["imported_inference_pods"].intervals == (60,)


def test_mig_slice_uses_8_of_9_75_gib_and_reports_no_power():
    for spec in _jobs("mig_slice_inference"):
        s, g = spec.slots[0], spec.truths[0]
        assert s.uuid.startswith("MIG-") and s.device.mig_profile == "1g.10gb"
        r = render(g, t0=0, interval_s=10, field_set=spec.field_set, rng=np.random.default_rng(0))
        used = r.cols["fb_used_bytes"].max() / 2**30
        assert 7.5 < used < 8.5 and abs(r.cols["fb_total_bytes"][0] / 2**30 - 9.75) < 0.01
        assert "power_w" not in r.cols and "sm_clock_mhz" not in r.cols


def test_coarse_sampling_averages_profiling_but_not_the_duty_cycle():
    """DCGM profiling fields are interval means; NVML's gpu_util is a point reading."""
    spec = _jobs("dataloader_input_stall")[0]
    g = spec.truths[0]
    fine = render(g, t0=0, interval_s=1, field_set="dcgm", rng=np.random.default_rng(0))
    coarse = render(g, t0=0, interval_s=60, field_set="dcgm", rng=np.random.default_rng(0))
    late = fine.ts > 600
    assert fine.cols["sm_active"][late].std() > 2 * coarse.cols["sm_active"][coarse.ts > 600].std()
    # at 60 s gpu_util still alternates (a point sample), sm_active no longer does
    assert coarse.cols["gpu_util"][coarse.ts > 600].std() > 0.2


def test_the_hang_and_the_checkpoint_look_alike_and_differ_only_in_length():
    hung = _jobs("hung_collective")[0].truths[1]
    ck = _jobs("checkpoint_10min_barrier")[0].truths[1]
    spin_h = (hung.act["duty"] > 0.95) & (hung.act["sm"] < 0.2)
    spin_c = (ck.act["duty"] > 0.95) & (ck.act["sm"] < 0.2)
    assert spin_h.sum() >= 7000 and 500 <= spin_c.sum() <= 660
    assert hung.act["tensor"][spin_h].max() == 0 and hung.act["nvlink"][spin_h].max() == 0
