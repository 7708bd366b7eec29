"""storage/raw_compact.py: the blocks of a closed window merge into one per (GPU, job) with
every sample kept bit for bit; open windows and single blocks are left alone; a second pass
finds nothing; a sample stored twice by concurrent writers is kept once (SQLite and
PostgreSQL)."""

from __future__ import annotations

import numpy as np
from sqlalchemy import text

from gpufleet.storage import retention
from gpufleet.storage.db import make_engine
from gpufleet.storage.fields import NF
from gpufleet.storage.raw_compact import COMPACT_AFTER_S, compact_windows
from gpufleet.storage.raw_read import read_raw
from gpufleet.storage.raw_samples import BLOCK_S, insert_samples

W0 = 1_764_547_200.0  # a window (and day) start


def _write(e, t0: float, secs: int, gpus: list[int], job: int, seed: int) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    ts = np.tile(t0 + np.arange(secs, dtype=np.float64), len(gpus))
    gpu = np.repeat(gpus, secs).astype(np.int64)
    vals = rng.uniform(0, 1, (NF, len(ts))).astype(np.float32).astype(np.float64)
    vals[3, ::4] = np.nan
    with e.begin() as c:
        insert_samples(c, ts, gpu, np.full(len(ts), job, np.int64), vals)


def _blocks(e) -> int:  # type: ignore[no-untyped-def]
    with e.connect() as c:
        return int(c.execute(text("select count(*) from gpu_sample_blocks")).scalar_one())


def _all(e):  # type: ignore[no-untyped-def]
    with e.connect() as c:
        return read_raw(c)


def test_closed_windows_merge_and_keep_every_sample(database_url: str) -> None:
    e = make_engine(database_url)
    try:
        retention.ensure_partitions(e, [W0])
        for k in range(6):  # six 10-s writes of 2 GPUs in the first window, job 1
            _write(e, W0 + 10 * k, 10, [1, 2], 1, k)
        _write(e, W0 + 300, 10, [1], -1, 9)  # GPU 1 without a job: its own block
        _write(e, W0 + BLOCK_S, 10, [1], 1, 10)  # next window: one block, nothing to merge
        _write(e, W0 + BLOCK_S + 10, 10, [1], 1, 11)  # ... and a second, but that window is open
        before = _all(e)
        assert _blocks(e) == 12 + 1 + 2
        now = W0 + 2 * BLOCK_S - 1 + COMPACT_AFTER_S  # the second window not closed yet
        assert compact_windows(e, now) == 2  # (GPU 1, job 1) and (GPU 2, job 1) in window 0
        assert _blocks(e) == 2 + 1 + 2
        after = _all(e)
        assert np.array_equal(after.ts, before.ts) and np.array_equal(after.gpu_pk, before.gpu_pk)
        assert np.array_equal(after.job_pk, before.job_pk)
        assert np.array_equal(np.isnan(after.vals), np.isnan(before.vals))
        ok = ~np.isnan(before.vals)
        assert np.array_equal(after.vals[ok].view(np.uint64), before.vals[ok].view(np.uint64))
        assert compact_windows(e, now) == 0
        assert compact_windows(e, now + BLOCK_S) == 1  # the second window closed
        assert _blocks(e) == 2 + 1 + 1
        assert len(_all(e)) == len(before)
    finally:
        e.dispose()


def test_a_sample_stored_twice_is_kept_once(database_url: str) -> None:
    e = make_engine(database_url)
    try:
        retention.ensure_partitions(e, [W0])
        _write(e, W0, 10, [5], 1, 1)
        _write(e, W0, 10, [5], 1, 2)  # the same (GPU, ts) again: what two racing writers leave
        # reads already coalesce the two copies (one decoder: sample_codec.coalesce); the
        # blocks still hold both until compaction rewrites them
        assert len(_all(e)) == 10
        with e.connect() as c:
            assert c.execute(text("select sum(n) from gpu_sample_blocks")).scalar_one() == 20
        assert compact_windows(e, W0 + BLOCK_S + COMPACT_AFTER_S) == 1
        got = _all(e)
        assert len(got) == 10 and np.array_equal(got.ts, W0 + np.arange(10.0))
        with e.connect() as c:
            assert c.execute(text("select sum(n) from gpu_sample_blocks")).scalar_one() == 10
    finally:
        e.dispose()


def test_raw_retention_of_hours_deletes_within_the_day(database_url: str) -> None:
    """raw_days = 0.25 keeps 6 hours, even inside one daily partition (PostgreSQL drops only
    whole days; the blocks ending before the cutoff in the day holding it are deleted)."""
    e = make_engine(database_url)
    try:
        retention.ensure_partitions(e, [W0])
        _write(e, W0 + 2 * 3600, 10, [1, 2], 1, 1)  # 18 h before "now": expired
        _write(e, W0 + 14 * 3600 + 95, 10, [1], 1, 2)  # a block straddling the cutoff is kept whole
        _write(e, W0 + 19 * 3600, 10, [1], 1, 3)  # 1 h old: kept
        retention.apply_retention(e, W0 + 20 * 3600 + 100, raw_days=0.25, rollup_days=400)  # cutoff 14 h + 100 s
        got = _all(e)
        assert len(got) == 20 and got.ts.min() == W0 + 14 * 3600 + 95
    finally:
        e.dispose()
