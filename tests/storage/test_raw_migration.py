"""Migration 0012 converts the wide raw table (a row per GPU-second) into compressed blocks
and keeps every sample: a database at 0011 holding a day (one GPU at 1 Hz for 86,400 s,
three more every 10 s, nulls, rows with and without a job, two jobs on one GPU) is upgraded,
and every (gpu, ts, field value) is read back through ``raw_read`` bit for bit. Then down
and up again, which must give the same samples."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import text

from gpufleet.storage import retention
from gpufleet.storage.copy_encoding import insert_wide_rows
from gpufleet.storage.db import make_engine
from gpufleet.storage.fields import FIELD_INDEX, FIELDS, NF
from gpufleet.storage.migrate import downgrade, upgrade
from gpufleet.storage.raw_read import count_raw_samples, read_raw

DAY0 = 1_764_547_200.0  # 2025-12-01 00:00 UTC


def _day_of_samples() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    ts_parts, gpu_parts, job_parts = [], [], []
    t = DAY0 + np.arange(86_400, dtype=np.float64)
    ts_parts.append(t)
    gpu_parts.append(np.full(len(t), 1))
    job_parts.append(np.where(t < DAY0 + 40_000, 5, np.where(t < DAY0 + 60_000, -1, 6)))  # job, none, another
    for g in (2, 3, 4):
        t = DAY0 + 3.5 + np.arange(0, 86_400, 10, dtype=np.float64)
        ts_parts.append(t)
        gpu_parts.append(np.full(len(t), g))
        job_parts.append(np.full(len(t), 7 if g != 4 else -1))
    ts, gpu, job = np.concatenate(ts_parts), np.concatenate(gpu_parts), np.concatenate(job_parts)
    n = len(ts)
    vals = np.empty((NF, n))
    for j, f in enumerate(FIELDS):
        if f.dtype == "f4":  # noisy, through float32 as the collector stores them
            walk = np.clip(0.5 + np.cumsum(rng.normal(0, 0.01, n)) % 0.5, 0, 1) * min(f.max, 1e4)
            vals[j] = walk.astype(np.float32)
        elif f.dtype == "i8":
            vals[j] = np.minimum(np.cumsum(rng.random(n) < 0.001), f.max)
        else:
            vals[j] = 1e7 + np.cumsum(rng.uniform(0, 700, n))
        vals[j][rng.random(n) < 0.02] = np.nan  # absent here and there
    vals[FIELD_INDEX["ib_tx_bytes_s"]] = np.nan  # never sent
    return ts, gpu.astype(np.int64), job.astype(np.int64), vals


def _fill_wide(url: str, ts: np.ndarray, gpu: np.ndarray, job: np.ndarray, vals: np.ndarray) -> None:
    e = make_engine(url)
    try:
        if e.dialect.name == "postgresql":
            with e.begin() as c:
                c.execute(text(retention.create_partition_sql("gpu_samples", int(DAY0))))
        with e.begin() as c:
            insert_wide_rows(c, ts, gpu, job, vals)
    finally:
        e.dispose()


def _assert_all_there(url: str, ts: np.ndarray, gpu: np.ndarray, job: np.ndarray, vals: np.ndarray) -> None:
    e = make_engine(url)
    try:
        with e.connect() as c:
            got = read_raw(c)
            assert count_raw_samples(c) == len(ts)
            assert count_raw_samples(c, job_pk=5) == int((job == 5).sum())
    finally:
        e.dispose()
    order = np.lexsort((ts, gpu))
    assert len(got) == len(ts)
    assert np.array_equal(got.gpu_pk, gpu[order])
    assert np.array_equal(got.ts.view(np.uint64), ts[order].view(np.uint64))
    assert np.array_equal(got.job_pk, job[order])
    want = vals[:, order]
    assert np.array_equal(np.isnan(got.vals), np.isnan(want))
    present = ~np.isnan(want)
    assert np.array_equal(got.vals[present].view(np.uint64), want[present].view(np.uint64))


@pytest.fixture(params=["sqlite", "postgresql"])
def url_at_0011(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'old.db'}"
    else:
        url = request.getfixturevalue("pg_factory").empty()
    upgrade(url, "0011")
    return url


def test_upgrade_keeps_every_sample_of_a_day(url_at_0011: str) -> None:
    ts, gpu, job, vals = _day_of_samples()
    _fill_wide(url_at_0011, ts, gpu, job, vals)
    upgrade(url_at_0011, "0012")
    e = make_engine(url_at_0011)
    try:
        with e.connect() as c:
            tables = set(c.dialect.get_table_names(c))
            blocks = c.execute(text("select count(*) from gpu_sample_blocks")).scalar_one()
    finally:
        e.dispose()
    assert "gpu_samples" not in tables
    assert blocks < len(ts) / 50  # blocks, not a row per sample
    _assert_all_there(url_at_0011, ts, gpu, job, vals)
    downgrade(url_at_0011, "0011")
    upgrade(url_at_0011, "0012")
    _assert_all_there(url_at_0011, ts, gpu, job, vals)
