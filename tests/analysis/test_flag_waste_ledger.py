"""Every stored flag's ``wasted_gpu_hours`` is its share of the job's ledger (issue 35), on
SQLite and PostgreSQL: a 10-rank job (2 nodes x 5 GPUs) with one slow rank and a restart of
every rank, its telemetry and progress stored through the collector's write path, analysed by
the real runner (which runs the progress pass). The flags never add up to more than the
ledger's waste, each equals the share ``GET /api/v1/jobs/{id}/ledger`` reports, a rank's flag
gets 0 (its kind has no category: the peers' wait is inside their steps), and the fleet
summary's waste is the fleet ledger's for the same range."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet.agent.simulator import gpu_uuid, make_job
from gpufleet.analysis.runner import run_analysis
from gpufleet.api.queries.fleet import fleet_summary
from gpufleet.api.queries.ledger import fleet_ledger, job_ledger
from gpufleet.collector.columns import prepare
from gpufleet.protocol import AgentInfo, Batch
from gpufleet.settings import CostSettings
from gpufleet.storage.gpu_ledger import read_job_ledger
from gpufleet.storage.models import Flag, Job
from gpufleet.storage.writes import write_batches

from ..progress.test_progress_flags import Proc, fold
from .conftest import ingest

RANKS, PER_NODE, DURATION = 10, 5, 2400.0
SLOW = 7


def _store_progress(engine: Any, job: Any, wall0: float) -> float:
    """The ranks' training loops (rank 7 steps 1.5x slower; every rank killed 1100 s in and
    restarted from its checkpoint at step 1200 a minute later) folded by the relay and stored
    through the collector, one batch per node. Returns the clock at the end."""
    procs = []
    for r, (node, idx) in enumerate(job.gpus):
        step = 0.75 if r == SLOW else 0.5
        common = {"host": node, "gpu": gpu_uuid(node, idx), "step_s": step, "ckpt_every": 1200, "ckpt_s": 20.0,
                  "eval_every": 0}
        procs += [Proc(r, 100 + r, 0.0, t1=1100.0, **common),
                  Proc(r, 200 + r, 1160.0, first_step=1201, load_s=10.0, **common)]
    ws, end = fold(job.job_id, procs, DURATION, wall0)
    with engine.begin() as c:
        for node in job.nodes:
            mine = [w for w in ws if w.host == node]
            write_batches(c, [prepare(Batch(agent=AgentInfo(boot_id=f"p-{node}", seq=0, node=node), progress=mine))],
                          now=end)
    return end


def test_flags_are_their_ledger_share(engine: Any) -> None:
    wall0 = float(int(time.time() // 60) * 60 - 4 * 3600)  # real time: the fleet summary's window is "now"
    job = make_job("vision_train", "j-fw", RANKS, wall0 - 60, DURATION + 120, node_prefix="fw", gpus_per_node=PER_NODE)
    end = _store_progress(engine, job, wall0)
    ingest(engine, job, wall0 - 60, wall0 + DURATION + 60, interval_s=2.0)
    s = run_analysis(engine, now=end)
    assert s.errors == [], s.errors
    with engine.connect() as c:
        pk = c.execute(select(Job.id).where(Job.job_id == "j-fw")).scalar_one()
        totals: dict[str, float] = {}
        for _, cat, secs in read_job_ledger(c, pk):
            totals[cat] = totals.get(cat, 0.0) + secs / 3600
        flags = list(c.execute(select(Flag.kind, Flag.scope, Flag.wasted_gpu_hours).where(Flag.job_pk == pk)))
    kinds = {(f.kind, f.scope) for f in flags}
    assert ("slow_rank", f"progress:rank{SLOW}") in kinds, kinds
    assert ("restart_lost_progress", "progress") in kinds, kinds
    non_productive = sum(v for k, v in totals.items() if k not in ("productive", "unobserved"))
    assert totals.get("restart_lost", 0.0) > 0.1
    stored = {(f.kind, f.scope): float(f.wasted_gpu_hours) for f in flags}
    # Two flags never claim one second: together no more than the ledger's waste.
    assert sum(stored.values()) <= non_productive + 1e-3, (stored, non_productive)
    assert sum(stored.values()) <= RANKS * (DURATION + 120) / 3600
    # A rank's flag: no category, no second (the detector's estimate is not waste).
    assert stored[("slow_rank", f"progress:rank{SLOW}")] == 0.0
    # The restart's flag: the ledger's restart_lost (no hardware flag holds any of it).
    assert abs(stored[("restart_lost_progress", "progress")] - totals["restart_lost"]) < 1e-3
    with Session(engine) as session:
        j = session.get(Job, pk)
        assert j is not None
        api = job_ledger(session, j, "default", CostSettings())
        shares = {(f["kind"], f["scope"]): f["wasted_gpu_hours"] for f in api["flags"]}
        assert shares == {k: round(v, 4) for k, v in stored.items()}
        # The fleet summary's waste is the fleet ledger's over the same range.
        summ = fleet_summary(session, window_s=86400.0)
        led = fleet_ledger(session, group_by="cause", start=summ["start"], end=summ["end"], cluster=None,
                           cost=CostSettings())
    assert summ["wasted_gpu_hours_total"] == led["total"]["wasted_gpu_hours"]
    assert abs(led["total"]["wasted_gpu_hours"] - non_productive) < 1e-2
    by_cause = {g["key"]: g["gpu_hours"] for g in led["groups"] if g["kind"] == "badput"}
    assert summ["wasted_gpu_hours"] == by_cause
    # ... and its users add up to it (the window's ledger minutes, not the reports' lifetimes).
    assert abs(sum(u["wasted_gpu_hours"] for u in summ["top_users"]) - summ["wasted_gpu_hours_total"]) < 1e-3
    # A second pass changes no flag's waste.
    run_analysis(engine, now=end)
    with engine.connect() as c:
        again = {(f.kind, f.scope): float(f.wasted_gpu_hours) for f in c.execute(
            select(Flag.kind, Flag.scope, Flag.wasted_gpu_hours).where(Flag.job_pk == pk))}
    assert again == stored
