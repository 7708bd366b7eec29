"""The stored ledger on SQLite and PostgreSQL: the runner writes each job's ledger per minute
beside its report (the rows add up to the report's numbers), a second pass writes nothing, and
migration 0015 marks old reports due (features kept) or writes their ledger from the report
(features pruned)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, insert, select

from gpufleet.agent.simulator import make_job
from gpufleet.analysis.runner import run_analysis
from gpufleet.storage.db import make_engine
from gpufleet.storage.gpu_ledger import GpuLedgerMinute, read_job_ledger
from gpufleet.storage.migrate import downgrade, upgrade
from gpufleet.storage.models import Cluster, Job, JobReport

from .conftest import T0, ingest


def test_runner_stores_the_ledger_that_adds_up(engine: Any) -> None:
    idle = make_job("idle_gpu", "j-idle", 2, T0, 3600, node_prefix="n")
    good = make_job("vision_train", "j-good", 2, T0, 3600, node_prefix="m")
    t1 = T0 + 30 * 60
    ingest(engine, idle, T0, t1)
    ingest(engine, good, T0, t1)
    s = run_analysis(engine, now=t1 + 5)
    assert s.errors == []
    with engine.connect() as c:
        for job_id in ("j-idle", "j-good"):
            pk, rep = c.execute(select(Job.id, JobReport.report).join(JobReport, JobReport.job_pk == Job.id)
                                .where(Job.job_id == job_id)).one()
            rows = read_job_ledger(c, pk)
            by_cat: dict[str, float] = {}
            for _, cat, secs in rows:
                by_cat[cat] = by_cat.get(cat, 0.0) + secs / 3600
            led = rep["ledger"]
            assert abs(sum(by_cat.values()) - rep["allocated_gpu_hours"]) < 1e-3
            for k, v in led["categories"].items():
                assert abs(by_cat.get(k, 0.0) - v) < 1e-3, (job_id, k)
            # the report's numbers are the ledger's
            assert rep["goodput_score"] == led["goodput"]
            flagged = sum(f["wasted_gpu_hours"] for f in rep["flags"])
            assert abs(flagged - rep["wasted_gpu_hours_total"]) < 1e-3
        n = c.execute(select(func.count()).select_from(GpuLedgerMinute)).scalar_one()
    assert n > 0
    with engine.connect() as c:
        before = sorted(c.execute(select(GpuLedgerMinute.__table__)).all())
    run_analysis(engine, now=t1 + 5, job_pks=None)
    with engine.connect() as c:
        assert sorted(c.execute(select(GpuLedgerMinute.__table__)).all()) == before


def test_migration_0015_marks_or_backfills(database_url: str) -> None:
    downgrade(database_url, "0014")
    e = make_engine(database_url)
    try:
        with e.begin() as c:
            cl = c.execute(select(Cluster.id).where(Cluster.name == "default")).scalar_one()
            kept, pruned = (c.execute(insert(Job).values(cluster_id=cl, job_id=str(i), state="ended", start_ts=T0,
                                                         end_ts=T0 + 1800, last_sample_ts=T0 + 1800)
                                      .returning(Job.id)).scalar_one() for i in range(2))
            for pk in (kept, pruned):
                c.execute(insert(JobReport).values(
                    job_pk=pk, computed_at=T0, analyzed_until=T0 + 1800, goodput_score=0.5,
                    allocated_gpu_hours=1.0, wasted_gpu_hours=0.3,
                    report={"version": 2, "window": {"start": T0, "end": T0 + 1800},
                            "wasted_gpu_hours": {"idle_gpu": 0.3, "low_sm_activity": 0.3}}))
        with e.begin() as c:  # the kept job's first feature hour is still stored
            from gpufleet.storage.feature_models import job_hist_features

            h: Any = [0] if database_url.startswith("postgresql") else b""
            c.execute(insert(job_hist_features).values(job_pk=kept, hour=int(T0 // 3600), folds=1, h=h))
        upgrade(database_url)
        with e.connect() as c:
            until = dict(c.execute(select(JobReport.job_pk, JobReport.analyzed_until)).all())
            assert until[kept] == -1 and until[pruned] == T0 + 1800
            assert read_job_ledger(c, kept) == []
            rows = read_job_ledger(c, pruned)
        by_cat: dict[str, float] = {}
        for _, cat, secs in rows:
            by_cat[cat] = by_cat.get(cat, 0.0) + secs / 3600
        assert abs(sum(by_cat.values()) - 1.0) < 1e-3
        assert abs(by_cat["idle_gpu"] - 0.15) < 1e-3 and abs(by_cat["productive"] - 0.5) < 1e-3
        assert abs(by_cat["unobserved"] - 0.2) < 1e-3
        assert {m for m, _, _ in rows} == set(range(int(T0 // 60), -int(-(T0 + 1800) // 60)))
        downgrade(database_url, "0014")
        upgrade(database_url)
    finally:
        e.dispose()


def test_runner_folds_the_jobs_progress(engine: Any) -> None:
    """A job whose ranks report progress: its ledger is decided by progress where it covers
    (a checkpoint span stays a checkpoint, whatever the GPUs looked like)."""
    from gpufleet.agent.simulator import gpu_uuid
    from gpufleet.storage.progress_models import JobProgress

    job = make_job("vision_train", "j-prog", 2, T0, 3600, node_prefix="p")
    t1 = T0 + 30 * 60
    ingest(engine, job, T0, t1)
    with engine.begin() as c:
        pk = c.execute(select(Job.id).where(Job.job_id == "j-prog")).scalar_one()
        rows = []
        for rank, (node, idx) in enumerate(job.gpus):
            t, step = T0 + 60, 0
            while t + 10 <= t1:
                ckpt = int((t - T0) // 10) % 30 == 0  # one 10 s window in 30 is a checkpoint save
                rows.append({"job_pk": pk, "rank": rank, "pid": 100 + rank, "gpu": gpu_uuid(node, idx),
                             "start_ts": t, "end_ts": t + 10, "steps": 0 if ckpt else 10,
                             "first_step": None if ckpt else step, "last_step": None if ckpt else step + 9,
                             "max_step": None if ckpt else step + 9, "restarts": 0, "lost_steps": 0,
                             "productive_s": 0.0 if ckpt else 10.0, "stall_s": 0.0, "unfinished_s": 0.0,
                             "spans": {"checkpoint_save": 10.0} if ckpt else {}, "alive": True, "ended": False,
                             "process_start": T0 + 60 if t == T0 + 60 else None, "dropped": 0})
                step += 0 if ckpt else 10
                t += 10
        c.execute(insert(JobProgress), rows)
    assert run_analysis(engine, now=t1 + 5).errors == []
    with engine.connect() as c:
        rep = c.execute(select(JobReport.report).where(JobReport.job_pk == pk)).scalar_one()
        stored = read_job_ledger(c, pk)
    led = rep["ledger"]
    assert led["progress"] is True
    ckpt_h = led["categories"]["checkpoint_save"]
    assert abs(ckpt_h - len([r for r in rows if r["spans"]]) * 10 / 3600) < 2e-3
    assert abs(sum(led["categories"].values()) - rep["allocated_gpu_hours"]) < 1e-3
    assert abs(sum(s for _, cat, s in stored if cat == "checkpoint_save") / 3600 - ckpt_h) < 1e-3


def test_write_job_ledger_rewrites_only_what_changed(engine: Any) -> None:
    import numpy as np

    from gpufleet.storage.gpu_ledger import write_job_ledger

    with engine.begin() as c:
        cl = c.execute(select(Cluster.id).where(Cluster.name == "default")).scalar_one()
        pk = c.execute(insert(Job).values(cluster_id=cl, job_id="w", state="running", start_ts=T0)
                       .returning(Job.id)).scalar_one()
        v1 = {"productive": np.array([60.0, 60.0, 30.0]), "idle_gpu": np.array([0.0, 0.0, 30.0])}
        assert write_job_ledger(c, pk, 100, v1) == 4
        assert write_job_ledger(c, pk, 100, v1) == 0  # the same ledger: nothing written
        v2 = {"productive": np.array([60.0, 60.0, 60.0, 45.0]), "throttled": np.array([0.0, 0.0, 0.0, 15.0])}
        assert write_job_ledger(c, pk, 100, v2) == 3  # minute 102 rewritten, minute 103 added
        assert read_job_ledger(c, pk) == [(100, "productive", 60.0), (101, "productive", 60.0),
                                          (102, "productive", 60.0), (103, "productive", 45.0),
                                          (103, "throttled", 15.0)]
