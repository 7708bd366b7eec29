"""Migration 0009 rescales scores stored on the old 0..100 scale (report version 1) to the
API's 0..1, leaves new reports alone, and goes back down; on SQLite and PostgreSQL."""

from __future__ import annotations

from sqlalchemy import insert, select

from gpufleet.storage.db import make_engine
from gpufleet.storage.migrate import downgrade, upgrade
from gpufleet.storage.models import Cluster, Job, JobReport


def test_old_scores_become_ratios(database_url: str) -> None:
    downgrade(database_url, "0008")
    e = make_engine(database_url)
    try:
        with e.begin() as c:
            cl = c.execute(select(Cluster.id).where(Cluster.name == "default")).scalar_one()
            pks = [c.execute(insert(Job).values(cluster_id=cl, job_id=str(i), state="ended", start_ts=0.0, end_ts=1.0)
                           .returning(Job.id)).scalar_one() for i in range(3)]
            for pk, score, version in zip(pks, (71.3, None, 0.42), (1, 1, 2), strict=True):
                c.execute(insert(JobReport).values(job_pk=pk, computed_at=1.0, analyzed_until=1.0, goodput_score=score,
                                                   allocated_gpu_hours=1.0, wasted_gpu_hours=0.0,
                                                   report={"version": version, "goodput_score": score}))
        upgrade(database_url)
        with e.connect() as c:
            got = dict(c.execute(select(JobReport.job_pk, JobReport.goodput_score)).all())
        assert [got[p] for p in pks] == [71.3 / 100, None, 0.42]
        downgrade(database_url, "0008")
        with e.connect() as c:
            got = dict(c.execute(select(JobReport.job_pk, JobReport.goodput_score)).all())
        assert abs(got[pks[0]] - 71.3) < 1e-9 and abs(got[pks[2]] - 42.0) < 1e-9  # the old scale
        upgrade(database_url)
    finally:
        e.dispose()
