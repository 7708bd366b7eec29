"""Database readers for the progress analysis (the only part of it that touches storage):
a job's windows, its allocation, its GPUs' peak; then the pure functions do the rest."""

from __future__ import annotations

from collections import Counter
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from gpufleet.catalog import CATALOG
from gpufleet.storage.models import Allocation as AllocationRow
from gpufleet.storage.models import Gpu, Job, Node, job_samples_1m
from gpufleet.storage.progress_models import JobProgress

from .detect import ProgressThresholds, detect_all
from .detectors import ClockAt
from .goodput import GpuBusy, job_goodput
from .model import Allocation, Goodput, Window

MAX_WINDOWS = 200_000  # ~23 GPU-rank-days of windows; older ones are summarised by what is read


def load_windows(conn: Connection | Session, job_pk: int, since: float | None = None) -> list[Window]:
    t = JobProgress.__table__
    q = (select(t, Node.name.label("node_name")).outerjoin(Node, Node.id == t.c.node_id)
         .where(t.c.job_pk == job_pk).order_by(t.c.start_ts, t.c.rank).limit(MAX_WINDOWS))
    if since is not None:
        q = q.where(t.c.end_ts >= since)
    return [Window.from_row(r, r["node_name"]) for r in conn.execute(q).mappings()]


def job_allocation(conn: Connection | Session, job_pk: int, now: float) -> Allocation | None:
    """The scheduler's view when the job holds GPUs (allocations), else the job's own start and
    end when known, else None (the analysis then uses the extent of the job's processes)."""
    a = AllocationRow.__table__
    row = conn.execute(select(func.min(a.c.start_ts), func.max(func.coalesce(a.c.end_ts, now)))
                       .where(a.c.job_pk == job_pk)).first()
    if row is not None and row[0] is not None:
        return Allocation(float(row[0]), float(min(row[1], now)), "allocations")
    j = conn.execute(select(Job.start_ts, Job.end_ts).where(Job.id == job_pk)).first()
    if j is not None and j[0] is not None and j[1] is not None:
        return Allocation(float(j[0]), float(j[1]), "job")
    return None


def job_gpu_peak(conn: Connection | Session, job_pk: int) -> tuple[float | None, int]:
    """(peak dense tensor TFLOP/s per GPU of the job's GPU model, GPUs allocated)."""
    a = AllocationRow.__table__
    models = Counter(m for (_, m) in conn.execute(select(Gpu.id, Gpu.model).join(a, a.c.gpu_pk == Gpu.id)
                                                   .where(a.c.job_pk == job_pk).distinct()) if m)
    n = conn.execute(select(func.count(func.distinct(a.c.gpu_pk))).where(a.c.job_pk == job_pk)).scalar_one()
    if not models:
        return None, int(n or 0)
    gm = CATALOG.gpu_model(models.most_common(1)[0][0])
    return (gm.peak_tensor_tflops if gm else None), int(n or 0)


IDLE_UTIL = 0.05  # NVML utilisation under which the job's GPUs ran no kernel (analysis: idle_gpu_util)


def hardware_busy(conn: Connection | Session, job_pk: int, t0: float, t1: float) -> GpuBusy | None:
    """From the job's 1-minute rollups: were its GPUs running kernels in [a, b]? (NVML
    utilisation, else SM activity); None where no minute is known: unknown is not idle."""
    t = job_samples_1m
    rows = conn.execute(select(t.c.bucket, t.c.gpu_util, t.c.sm_active).where(
        t.c.job_pk == job_pk, t.c.bucket >= t0 - 60, t.c.bucket <= t1).order_by(t.c.bucket)).all()
    if not rows:
        return None
    busy = {float(b): (u if u is not None else sm) for b, u, sm in rows}

    def gpu_busy(a: float, b: float) -> bool | None:
        vals = [v for m, v in busy.items() if m + 60 > a and m < b and v is not None]
        return None if not vals else max(vals) >= IDLE_UTIL

    return gpu_busy


def goodput_for_job(conn: Connection | Session, job_pk: int, now: float, *,
                    eval_productive: bool = False) -> tuple[Goodput | None, list[Window]]:
    ws = load_windows(conn, job_pk)
    if not ws:
        return None, ws
    alloc = job_allocation(conn, job_pk, now)
    peak, n_gpus = job_gpu_peak(conn, job_pk)
    busy = hardware_busy(conn, job_pk, min(w.start for w in ws), max(w.end for w in ws)) if n_gpus else None
    return job_goodput(ws, alloc, eval_productive=eval_productive, peak_tflops_per_gpu=peak,
                       n_gpus=n_gpus or None, gpu_busy=busy), ws


BUSY_FOR_CLOCKS = 0.5  # minutes busier than this say what clock the GPUs ran their work at


def hardware_clock(conn: Connection | Session, job_pk: int, ws: list[Window]) -> ClockAt | None:
    """The job's GPUs' SM clock over [a, b] from its 1-minute rollups, sample-weighted, busy
    minutes only: an idle GPU drops its clocks, which says nothing about how fast it worked."""
    if not ws:
        return None
    t = job_samples_1m
    t0, t1 = min(w.start for w in ws), max(w.end for w in ws)
    rows = conn.execute(select(t.c.bucket, t.c.n, t.c.sm_clock_mhz, t.c.gpu_util, t.c.sm_active).where(
        t.c.job_pk == job_pk, t.c.bucket >= t0 - 60, t.c.bucket <= t1)).all()
    busy = [(float(b), float(n), float(c)) for b, n, c, u, sm in rows
            if c is not None and n and max(u or 0.0, sm or 0.0) >= BUSY_FOR_CLOCKS]
    if not busy:
        return None

    def clock_at(a: float, b: float) -> float | None:
        got = [(n, c) for m, n, c in busy if m + 60 > a and m < b]
        weight = sum(n for n, _ in got)
        return sum(n * c for n, c in got) / weight if weight else None

    return clock_at


def hardware_now(conn: Connection | Session, job_pk: int, ws: list[Window]) -> bool | None:
    """The job's GPUs busy over its newest 2 minutes of progress (the hang cross-check)."""
    if not ws:
        return None
    t1 = max(w.end for w in ws)
    busy = hardware_busy(conn, job_pk, t1 - 120, t1)
    return busy(t1 - 120, t1) if busy is not None else None


def goodput_view(conn: Connection | Session, job_pk: int, now: float, *, eval_productive: bool = False,
                 th: ProgressThresholds | None = None) -> dict[str, Any]:
    """``goodput`` of ``GET /api/v1/jobs/{id}``: from progress when the job reports it, else a
    marker that the page shows the hardware view (every number unknown, never zero)."""
    g, ws = goodput_for_job(conn, job_pk, now, eval_productive=eval_productive)
    if g is None:
        return {"source": "hardware", "ettr": None, "allocated_s": None, "productive_s": None, "badput_s": {},
                "tokens_per_s": None, "tokens_per_gpu_s": None, "mfu": None, "step_time_p50_s": None,
                "step_time_p95_s": None, "restarts": None,
                "note": "the job reports no progress (gpufleet.progress): goodput is the hardware estimate in summary"}
    out = g.as_dict()
    out["findings"] = [{"kind": f.kind, "scope": f.scope, "severity": f.severity, "ongoing": f.ongoing,
                        "start_ts": f.start_ts, "end_ts": f.end_ts, "evidence": f.evidence}
                       for f in detect_all(ws, g, now, th, gpu_busy=hardware_now(conn, job_pk, ws),
                                           clock_at=hardware_clock(conn, job_pk, ws))]
    out["per_rank"] = [{"rank": p.rank, "host": p.host, "node": p.node, "gpu": p.gpu,
                        "productive_s": round(p.productive_s, 3), "badput_s": {k: round(v, 3) for k, v in
                                                                               p.badput_s.items()},
                        "steps": p.steps, "restarts": p.restarts, "lost_steps": p.lost_steps,
                        "step_time_p50_s": p.step_time_p50_s, "step_time_p95_s": p.step_time_p95_s,
                        "processes": p.processes} for p in g.per_rank]
    return out


def fleet_goodput(conn: Connection | Session, since: float, now: float, *, eval_productive: bool = False,
                  max_jobs: int = 500) -> dict[str, Any]:
    """Fleet ETTR and badput by cause over the jobs that reported progress since ``since``,
    weighted by each job's ranks (GPU-seconds when one rank drives one GPU). Jobs without
    progress are counted, not guessed at."""
    t = JobProgress.__table__
    pks = [pk for (pk,) in conn.execute(select(t.c.job_pk).where(t.c.end_ts >= since).group_by(t.c.job_pk)
                                        .order_by(func.max(t.c.end_ts).desc()).limit(max_jobs))]
    alloc_w = prod_w = 0.0
    bad: dict[str, float] = {}
    for pk in pks:
        ws = load_windows(conn, pk, since=since)
        g = job_goodput(ws, job_allocation(conn, pk, now), eval_productive=eval_productive)
        if g is None or g.allocated_s <= 0:
            continue
        alloc_w += g.allocated_s * g.ranks
        prod_w += g.productive_s * g.ranks
        for k, v in g.badput_s.items():
            bad[k] = bad.get(k, 0.0) + v * g.ranks
    return {"source": "progress", "jobs": len(pks), "ettr": round(prod_w / alloc_w, 4) if alloc_w else None,
            "allocated_rank_hours": round(alloc_w / 3600, 3), "productive_rank_hours": round(prod_w / 3600, 3),
            "badput_rank_hours": {k: round(v / 3600, 4) for k, v in sorted(bad.items())}}
