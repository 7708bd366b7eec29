"""/api/v1/jobs/{id}/progress: a job's own progress per rank over time (docs/progress.md).
Mounted ahead of the jobs router, whose ``{job_id:path}`` would otherwise take the suffix."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query

from gpufleet.analysis.progress.load import goodput_view, load_windows

from .metrics import TimedRoute
from .queries.common import DEFAULT_CLUSTER, now
from .queries.jobs import find_job
from .routes_common import ClusterQ, JobIdPath, SessionDep
from .schemas import Message

router = APIRouter(prefix="/api/v1/jobs", tags=["jobs"], route_class=TimedRoute,
                   responses={400: {"model": Message, "description": "an argument is invalid (detail says which)"}})

SERIES = ("steps", "productive_s", "step_time_p50_s", "step_time_p95_s", "tokens", "samples", "stall_s",
          "since_step_s", "open_span", "last_step", "alive")


@router.get("/{job_id:path}/progress", summary="A job's own progress: per-rank 10 s series and goodput",
            responses={404: {"model": Message, "description": "no such job"}})
def read_job_progress(job_id: JobIdPath, session: SessionDep, cluster: ClusterQ = DEFAULT_CLUSTER,
                      eval_productive: Annotated[bool, Query(description="count eval spans as productive")] = False,
                      ) -> Any:
    found = find_job(session, cluster, job_id)
    if found is None:
        raise HTTPException(404, f"no job {job_id!r} in cluster {cluster!r}")
    job = found[0]
    t = now()
    windows = load_windows(session, job.id)
    ranks: dict[int, dict[str, Any]] = {}
    for w in windows:
        r = ranks.setdefault(w.rank, {"rank": w.rank, "host": w.host, "node": w.node, "gpu": w.gpu, "t": [],
                                      "spans": [], **{k: [] for k in SERIES}})
        r["t"].append(w.start)
        for k in SERIES:
            r[k].append(getattr(w, k))
        r["spans"].append(dict(w.spans))
        r["host"], r["node"], r["gpu"] = w.host or r["host"], w.node or r["node"], w.gpu or r["gpu"]
    goodput = goodput_view(session, job.id, t, eval_productive=eval_productive)
    slow = {f["evidence"].get("rank") for f in goodput.get("findings", []) if f["scope"].startswith("progress:rank")}
    for r in ranks.values():
        r["slow"] = r["rank"] in slow
    return {"job_id": job.job_id, "cluster": found[1], "window_s": 10.0, "source": goodput["source"],
            "goodput": goodput, "ranks": [ranks[k] for k in sorted(ranks)]}
