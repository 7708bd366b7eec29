"""A job seen only through its progress (no GPU telemetry: a real trace replayed through
``gpufleet.progress``) gets a ledger folded from its progress alone (issue 35), on SQLite and
PostgreSQL: 10 ranks, every rank killed 1100 s in and restarted from its checkpoint, stored
through the collector's write path and analysed by the real runner. Its ledger's categories
add up to its allocation (one GPU per rank x the extent of its windows), its restart flag's
stored waste is the ledger's ``restart_lost``, and the fleet ledger includes it."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet.agent.simulator import make_job
from gpufleet.analysis.runner import run_analysis
from gpufleet.api.queries.ledger import fleet_ledger
from gpufleet.settings import CostSettings
from gpufleet.storage.gpu_ledger import read_job_ledger
from gpufleet.storage.models import Flag, Job
from gpufleet.storage.progress_models import JobProgress

from .test_flag_waste_ledger import DURATION, PER_NODE, RANKS, _store_progress


def test_progress_only_job_has_a_ledger(engine: Any) -> None:
    wall0 = float(int(time.time() // 60) * 60 - 4 * 3600)
    job = make_job("vision_train", "j-fw", RANKS, wall0 - 60, DURATION + 120, node_prefix="po", gpus_per_node=PER_NODE)
    end = _store_progress(engine, job, wall0)  # progress only: no ingest of GPU samples
    s = run_analysis(engine, now=end)
    assert s.errors == [], s.errors
    with engine.connect() as c:
        pk = c.execute(select(Job.id).where(Job.job_id == "j-fw")).scalar_one()
        assert c.execute(select(Job.last_sample_ts).where(Job.id == pk)).scalar_one() is None
        p = JobProgress.__table__
        t0 = min(c.execute(select(p.c.start_ts).where(p.c.job_pk == pk)).scalars())
        t1 = max(c.execute(select(p.c.end_ts).where(p.c.job_pk == pk)).scalars())
        totals: dict[str, float] = {}
        for _, cat, secs in read_job_ledger(c, pk):
            totals[cat] = totals.get(cat, 0.0) + secs
        flags = {(f.kind, f.scope): float(f.wasted_gpu_hours) for f in c.execute(
            select(Flag.kind, Flag.scope, Flag.wasted_gpu_hours).where(Flag.job_pk == pk))}
    allocated = RANKS * (t1 - t0)  # no allocation rows, no job span: one GPU per rank x its windows' extent
    print(f"allocated {allocated / 3600:.4f} GPU-h, ledger {sum(totals.values()) / 3600:.4f} GPU-h:",
          {k: round(v / 3600, 4) for k, v in sorted(totals.items())})
    assert abs(sum(totals.values()) - allocated) <= 1e-3 * allocated, (sum(totals.values()), allocated)
    assert totals.get("productive", 0.0) > 0.5 * allocated
    assert totals.get("restart_lost", 0.0) > 0.1 * 3600
    assert ("restart_lost_progress", "progress") in flags, flags
    assert abs(flags[("restart_lost_progress", "progress")] - totals["restart_lost"] / 3600) < 1e-3
    with Session(engine) as session:
        led = fleet_ledger(session, group_by="cause", start=t0 - 60, end=t1 + 60, cluster=None, cost=CostSettings())
    assert abs(led["total"]["allocated_gpu_hours"] - allocated / 3600) < 1e-2, led["total"]
    by_cause = {g["key"]: g["gpu_hours"] for g in led["groups"] if g["kind"] == "badput"}
    assert abs(by_cause["restart_lost"] - totals["restart_lost"] / 3600) < 1e-2
    # A second pass writes nothing new and changes no flag's waste.
    s2 = run_analysis(engine, now=end)
    assert s2.errors == [] and pk not in s2.job_pks_changed, s2
    with engine.connect() as c:
        again = {(f.kind, f.scope): float(f.wasted_gpu_hours) for f in c.execute(
            select(Flag.kind, Flag.scope, Flag.wasted_gpu_hours).where(Flag.job_pk == pk))}
        assert abs(sum(v for _, _, v in read_job_ledger(c, pk)) - sum(totals.values())) < 1e-6
    assert again == flags
