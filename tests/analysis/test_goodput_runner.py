"""The DB runner on SQLite and PostgreSQL: samples through the real write path, reports and
flags written, idempotent, incremental for running jobs, flags resolve when jobs end."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from gpufleet.agent.simulator import make_job
from gpufleet.analysis.runner import run_analysis
from gpufleet.analysis.state import CACHE
from gpufleet.storage.models import Flag, Job, JobReport

from .conftest import T0, ingest


def _dump(engine: Any) -> tuple[list[Any], list[Any]]:
    with engine.connect() as c:
        reps = [tuple(r) for r in c.execute(select(JobReport.__table__).order_by(JobReport.job_pk))]
        flags = [tuple(r) for r in c.execute(select(Flag.__table__).order_by(Flag.id))]
    return reps, flags


def _flags(engine: Any, job_id: str) -> dict[tuple[str, str], Any]:
    with engine.connect() as c:
        rows = c.execute(select(Flag.__table__).join(Job, Job.id == Flag.job_pk).where(Job.job_id == job_id)).mappings()
        return {(r["kind"], r["scope"]): dict(r) for r in rows}


def test_reports_flags_idempotent_and_resolve(engine: Any) -> None:
    idle = make_job("idle_gpu", "j-idle", 2, T0, 4 * 3600, node_prefix="n")
    good = make_job("vision_train", "j-good", 2, T0, 4 * 3600, node_prefix="n")
    t1 = T0 + 40 * 60
    ingest(engine, idle, T0, t1)
    ingest(engine, good, T0, t1)

    s = run_analysis(engine, now=t1 + 5)
    assert s.errors == [] and s.jobs_analyzed == 2 and s.reports_written == 2
    f = _flags(engine, "j-idle")
    assert set(f) == {("idle_gpu", "")}
    fl = f[("idle_gpu", "")]
    assert fl["open"] and fl["opened_at"] == t1 + 5 and fl["resolved_at"] is None
    assert fl["evidence"]["idle_gpus"] == 2 and fl["wasted_gpu_hours"] > 0.5 and fl["suggestion"]
    assert _flags(engine, "j-good") == {}
    with engine.connect() as c:
        rep = c.execute(select(JobReport.report).join(Job, Job.id == JobReport.job_pk)
                        .where(Job.job_id == "j-idle")).scalar_one()
    assert rep["n_gpus"] == 2 and rep["gpu_model"] == "NVIDIA H100 80GB HBM3"
    assert rep["goodput_score"] == 0.0 and rep["wasted_gpu_hours"]["idle_gpu"] > 0.5
    assert rep["mfu"]["peak_tflops_per_gpu"] == 989.0

    # Idempotent: nothing changes, not even computed_at, also from a cold process cache.
    before = _dump(engine)
    s2 = run_analysis(engine, now=t1 + 35)
    assert s2.jobs_due == 0 and s2.reports_written == 0
    CACHE.clear()
    with engine.connect() as c:
        pks = list(c.execute(select(Job.id)).scalars())
    s3 = run_analysis(engine, now=t1 + 65, job_pks=pks)
    assert s3.jobs_analyzed == 2 and s3.reports_written == 0 and s3.flags_updated == 0
    assert _dump(engine) == before

    # Both jobs stop reporting; close_stale_jobs ends them and the open flag resolves.
    s4 = run_analysis(engine, now=t1 + 3600)
    assert s4.jobs_closed == 2 and s4.flags_resolved == 1
    fl = _flags(engine, "j-idle")[("idle_gpu", "")]
    assert not fl["open"] and fl["resolved_at"] == t1 + 3600
    assert run_analysis(engine, now=t1 + 3700).jobs_due == 0


def _feature_rows(engine: Any, since: float = 0.0) -> int:
    with engine.connect() as c:
        return int(c.exec_driver_sql(f"SELECT count(*) FROM gpu_minute_features WHERE bucket >= {since!r}").scalar())


def test_running_job_is_incremental_and_matches_cold(engine: Any) -> None:
    job = make_job("input_stall", "j-stall", 2, T0, 4 * 3600, node_prefix="m")
    t1 = T0 + 60 * 60
    ingest(engine, job, T0, t1)
    s1 = run_analysis(engine, now=t1)
    # The analysis reads minute features (one row per GPU-minute), never raw samples.
    assert s1.rows_read == _feature_rows(engine) <= 2 * 61
    t2 = t1 + 600
    ingest(engine, job, t1, t2)
    s2 = run_analysis(engine, now=t2)
    # Only the job-hour the new batches folded into is re-read (an hour starts at T0 + 2800 s).
    assert s2.rows_read == _feature_rows(engine, since=T0 + 2800) < _feature_rows(engine), s2.rows_read
    assert set(_flags(engine, "j-stall")) == {("input_stall", "")}
    assert _flags(engine, "j-stall")[("input_stall", "")]["open"]
    hot = _dump(engine)
    CACHE.clear()
    with engine.connect() as c:
        pk = c.execute(select(Job.id).where(Job.job_id == "j-stall")).scalar_one()
    s3 = run_analysis(engine, now=t2 + 30, job_pks=[pk])
    assert s3.rows_read == _feature_rows(engine) and s3.reports_written == 0
    assert _dump(engine) == hot


def test_flag_resolves_when_the_job_recovers(engine: Any) -> None:
    """An idle stretch opens idle_gpu; when work resumes the flag resolves (the row stays)."""
    job = make_job("idle_gpu", "j-rec", 1, T0, 4 * 3600, node_prefix="r")
    t1 = T0 + 40 * 60
    ingest(engine, job, T0, t1)
    run_analysis(engine, now=t1)
    assert _flags(engine, "j-rec")[("idle_gpu", "")]["open"]
    from gpufleet.agent.simulator import PROFILES

    job.profile = PROFILES["vision_train"]  # the user got the job going again
    t2 = t1 + 20 * 60
    ingest(engine, job, t1, t2, seed=1)
    s = run_analysis(engine, now=t2)
    assert s.flags_resolved == 1
    fl = _flags(engine, "j-rec")[("idle_gpu", "")]
    assert not fl["open"] and fl["resolved_at"] == t2 and fl["end_ts"] <= t1 + 60
