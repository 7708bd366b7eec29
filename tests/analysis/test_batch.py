"""analysis.batch.build_many (a pass's jobs' features and windows built together) gives every
job the arrays, and so the report, that from_states and build_windows give it alone, bit for
bit: jobs that share a group (same GPU and minute count), jobs on their own (a GPU missing
minutes, an allocated GPU that never reported, a lone shape), 1 s and 60 s sampling (the sample
interval from the minutes' spans, and from the gaps between minutes)."""

from __future__ import annotations

import json
from dataclasses import fields

import numpy as np

from gpufleet.analysis import batch
from gpufleet.analysis.batch import build_many
from gpufleet.analysis.config import load_thresholds
from gpufleet.analysis.features import READ_COLUMNS, from_states
from gpufleet.analysis.report import JobMeta, analyze
from gpufleet.analysis.windows import WindowFeatures, build_windows
from gpufleet.storage.minute_features import HIST_BINS, HIST_FIELDS, fold

T0 = 1_790_000_000.0


def _job(seed: int, n_gpus: int, seconds: int, step: float = 1.0,
         drop_gpu_minutes: bool = False) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Stored states (READ_COLUMNS rows, as read_states returns them) of one job's samples."""
    rng = np.random.default_rng(seed)
    t = T0 + 3 + np.arange(0, seconds, step, dtype=np.float64)
    ts = np.repeat(t, n_gpus)
    gpu = np.tile(np.arange(1, n_gpus + 1), len(t))
    n = len(ts)
    busy = rng.random(n) < rng.uniform(0.2, 0.9)
    cols = {"sm_active": np.where(busy, rng.uniform(0.3, 0.9, n), rng.uniform(0.0, 0.05, n)),
            "sm_occupancy": rng.uniform(0, 1, n), "tensor_active": rng.uniform(0, 0.5, n),
            "dram_active": rng.uniform(0, 1, n), "gpu_util": rng.uniform(0, 1, n),
            "power_w": rng.uniform(100, 700, n), "sm_clock_mhz": rng.uniform(1000, 1980, n),
            "clock_event_reasons": rng.choice([0.0, 4.0, 8.0], n), "fb_used_bytes": rng.uniform(1e9, 8e10, n),
            "fb_total_bytes": np.full(n, 8e10), "nvlink_tx_bytes_s": rng.uniform(0, 1e10, n)}
    cols["sm_active"][rng.random(n) < 0.03] = np.nan
    keep = np.ones(n, dtype=bool)
    if drop_gpu_minutes:  # GPU 1 silent for minutes 2-3: not every GPU in every minute
        keep = ~((gpu == 1) & (ts >= T0 + 120) & (ts < T0 + 240))
    f = fold(ts[keep], gpu[keep], np.ones(int(keep.sum()), np.int64), {k: v[keep] for k, v in cols.items()})
    c = {"bucket": f.bucket, "gpu_pk": f.gpu_pk.astype(np.float64), **f.cols}
    tot = f.hist.sum(axis=0)
    return np.column_stack([c[k] for k in READ_COLUMNS]), {
        name: tot[i * HIST_BINS:(i + 1) * HIST_BINS] for i, name in enumerate(HIST_FIELDS)}


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and bool(np.array_equal(a, b, equal_nan=True))


def test_built_together_equals_built_alone() -> None:
    th = load_thresholds()
    ws, cov = th.general.window_s, th.general.min_window_coverage
    jobs: list[tuple[np.ndarray, list[int]]] = []
    hists = []
    specs = [(4, 1800, 1.0, False)] * 4 + [(4, 1800, 2.0, False)] + [(2, 1500, 1.0, False)] * 3 + [(3, 1800, 60.0, False)] * 3 + [
        (4, 1800, 1.0, True), (5, 900, 2.0, False), (1, 3600, 1.0, False), (1, 3600, 1.0, False)]
    for seed, (g, secs, step, drop) in enumerate(specs):
        rows, h = _job(seed, g, secs, step, drop)
        jobs.append((rows, list(range(1, g + 1))))
        hists.append(h)
    jobs.append((jobs[0][0], [1, 2, 3, 4, 99]))  # an allocated GPU that never reported
    hists.append(hists[0])
    jobs.append((np.zeros((0, len(READ_COLUMNS))), [7]))  # nothing read yet
    hists.append(hists[0])
    batch.CHUNK_ROWS, old_chunk = 3 * 4 * 31, batch.CHUNK_ROWS  # groups split in chunks too (of 3 4-GPU jobs)
    try:
        built = build_many(jobs, ws, cov)
    finally:
        batch.CHUNK_ROWS = old_chunk
    assert len(built) == len(jobs)
    for i, ((rows, pks), b, h) in enumerate(zip(jobs, built, hists, strict=True)):
        alone = from_states(rows, pks)
        assert b.feats.b0 == alone.b0 and b.feats.interval_s == alone.interval_s, i
        assert _same(b.feats.n, alone.n), i
        assert b.feats.f.keys() == alone.f.keys() and all(_same(b.feats.f[k], alone.f[k]) for k in alone.f), i
        if not alone.n.sum():
            assert b.windows is None
            continue
        w = build_windows(alone, ws, cov)
        assert b.windows is not None and (b.windows.w_min, b.windows.b0, b.windows.k) == (w.w_min, w.b0, w.k)
        assert _same(b.windows.obs_s, w.obs_s) and _same(b.windows.valid, w.valid), i
        assert all(_same(getattr(b.windows.f, a.name), getattr(w.f, a.name)) for a in fields(WindowFeatures)), i
        assert b.windows.seen.keys() == w.seen.keys() and all(_same(b.windows.seen[k], w.seen[k]) for k in w.seen)
        meta = JobMeta(job_id=str(i), start_ts=T0, end_ts=None, running=True,
                       gpu_uuids=[f"GPU-{i}-{p}" for p in pks], gpu_nodes=[f"n{i}-{p // 2}" for p in pks],
                       gpu_indexes=list(range(len(pks))), model="NVIDIA H100 80GB HBM3")
        got = analyze(meta, b.feats, h, th=th, windows=b.windows)
        ref = analyze(meta, alone, h, th=th)
        assert json.dumps(got.report, sort_keys=True) == json.dumps(ref.report, sort_keys=True), i
        assert [(f.kind, f.scope) for f in got.findings] == [(f.kind, f.scope) for f in ref.findings]


def test_groups_are_what_is_built_together() -> None:
    # Jobs that reported throughout with one shape are one group (views of one block); a job
    # missing GPU-minutes is built alone (its own arrays).
    th = load_thresholds()
    a, b, c = (_job(s, 2, 600) for s in (1, 2, 3))
    gap, _ = _job(4, 2, 600, drop_gpu_minutes=True)
    got = build_many([(a[0], [1, 2]), (b[0], [1, 2]), (gap, [1, 2]), (c[0], [1, 2])], th.general.window_s,
                     th.general.min_window_coverage)
    bases = [x.feats.f["sm"].base for x in got]
    assert bases[0] is not None and bases[0] is bases[1] is bases[3]
    assert bases[2] is not bases[0]
