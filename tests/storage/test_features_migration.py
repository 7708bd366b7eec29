"""Migration 0011 backfills the minute features from the raw samples stored before it, so jobs
stored under 0010 keep their analysis: the folded states equal the reference fold of the
same rows (SQLite and PostgreSQL); down and up again works."""

from __future__ import annotations

import numpy as np
from sqlalchemy import text

from gpufleet.analysis.features import ALL_FEATURES, READ_COLUMNS, from_states, minute_features
from gpufleet.storage.db import make_engine
from gpufleet.storage.migrate import downgrade, upgrade
from gpufleet.storage.minute_features import HIST_BINS, HIST_FIELDS, fold_params, read_hist, read_states

T0 = 1_790_000_000.0  # inside the day partition created below


def test_backfill_folds_existing_samples(database_url: str) -> None:
    downgrade(database_url, "0010")
    e = make_engine(database_url)
    rng = np.random.default_rng(7)
    n_gpus, secs = 2, 400
    ts = np.repeat(T0 + np.arange(secs, dtype=np.float64), n_gpus)
    gi = np.tile(np.arange(n_gpus), secs)
    sm = np.round(rng.uniform(0, 1, len(ts)), 3)
    sm[::13] = np.nan
    power = np.round(rng.uniform(100, 700, len(ts)), 1)
    try:
        with e.begin() as c:
            if c.dialect.name == "postgresql":
                c.execute(text("CREATE TABLE gpu_samples_ptest PARTITION OF gpu_samples "
                               "FOR VALUES FROM (1789948800) TO (1790035200)"))
            cl = c.execute(text("SELECT id FROM clusters")).scalar()
            c.execute(text("INSERT INTO nodes (cluster_id, name) VALUES (:c, 'n1')"), {"c": cl})
            nid = c.execute(text("SELECT id FROM nodes")).scalar()
            gpks = []
            for i in range(n_gpus):
                c.execute(text('INSERT INTO gpus (node_id, uuid, "index") VALUES (:n, :u, :i)'),
                          {"n": nid, "u": f"GPU-m-{i}", "i": i})
                gpks.append(c.execute(text("SELECT id FROM gpus WHERE uuid = :u"), {"u": f"GPU-m-{i}"}).scalar())
            c.execute(text("INSERT INTO jobs (cluster_id, job_id, state, start_ts, source) "
                           "VALUES (:c, 'j1', 'running', :t, 'slurm')"), {"c": cl, "t": T0})
            job = c.execute(text("SELECT id FROM jobs")).scalar()
            c.execute(text("INSERT INTO gpu_samples (ts, gpu_pk, job_pk, sm_active, power_w) "
                           "VALUES (:t, :g, :j, :s, :p)"),
                      [{"t": t, "g": gpks[g], "j": job, "s": None if np.isnan(s) else float(s), "p": float(p)}
                       for t, g, s, p in zip(ts.tolist(), gi.tolist(), sm.tolist(), power.tolist(), strict=True)])
            stored = c.execute(text("SELECT CAST(sm_active AS DOUBLE PRECISION), CAST(power_w AS DOUBLE PRECISION) "
                                    "FROM gpu_samples ORDER BY ts, gpu_pk")).all()
        # the reference folds the values as stored (float4 on PostgreSQL)
        sm_db = np.array([np.nan if r[0] is None else r[0] for r in stored], dtype=np.float64)
        pw_db = np.array([r[1] for r in stored], dtype=np.float64)
        upgrade(database_url, "0011")
        with e.connect() as c:
            got = from_states(read_states(c, job, -1e18, 1e18), gpks)
            hist = read_hist(c, job)
        p = fold_params()
        ref = minute_features(ts, gi, {"sm_active": sm_db, "power_w": pw_db}, n_gpus,
                              busy_sm_active=p.busy_sm_active, throttle_mask=p.throttle_mask,
                              critical_xids=p.critical_xids)
        assert got.b0 == ref.b0 and got.shape == ref.shape and got.n.sum() == len(ts)
        for k in ALL_FEATURES:
            np.testing.assert_array_equal(got.f[k], ref.f[k], err_msg=k)
        sm_hist = np.sum([r.h for r in hist], axis=0)[:HIST_BINS]
        assert next(iter(HIST_FIELDS)) == "sm_active"
        assert sm_hist.sum() == int((~np.isnan(sm_db)).sum())
        assert len(READ_COLUMNS) > 10
        downgrade(database_url, "0010")
        upgrade(database_url, "0011")
        with e.connect() as c:
            again = from_states(read_states(c, job, -1e18, 1e18), gpks)
        np.testing.assert_array_equal(again.f["sm"], got.f["sm"])
    finally:
        e.dispose()
