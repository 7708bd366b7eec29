"""/api/v1/jobs/{id}/ledger and /api/v1/fleet/ledger: the GPU-time ledger (docs/goodput.md, "The
ledger"; shapes in docs/api.md, "Ledger"). Thin: api/queries/ledger.py sums the stored rows.
Mounted ahead of the jobs router, whose ``{job_id:path}`` would otherwise take the suffix."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Query

from .deps import SettingsDep
from .metrics import TimedRoute
from .queries.common import DEFAULT_CLUSTER, now, parse_time
from .queries.jobs import find_job
from .queries.ledger import fleet_ledger, job_ledger
from .routes_common import ClusterFilter, ClusterQ, JobIdPath, SessionDep
from .schemas import Message

router = APIRouter(prefix="/api/v1", tags=["ledger"], route_class=TimedRoute,
                   responses={400: {"model": Message, "description": "an argument is invalid (detail says which)"}})
TimeQ = Annotated[str | None, Query(max_length=40, description="epoch seconds, ISO-8601 (UTC) or -24h")]
GroupBy = Literal["cause", "job", "user", "account", "team", "cluster"]


@router.get("/jobs/{job_id:path}/ledger", summary="A job's GPU-time ledger: every allocated GPU-second once",
            responses={404: {"model": Message, "description": "no such job"}})
def read_job_ledger(job_id: JobIdPath, session: SessionDep, settings: SettingsDep,
                    cluster: ClusterQ = DEFAULT_CLUSTER,
                    step: Annotated[int, Query(ge=60, le=86400, description="seconds per point of the series, "
                                               "a multiple of 60")] = 60) -> Any:
    found = find_job(session, cluster, job_id)
    if found is None:
        raise HTTPException(404, f"no job {job_id!r} in cluster {cluster!r}")
    return job_ledger(session, found[0], found[1], settings.cost, step)


@router.get("/fleet/ledger", summary="The fleet's GPU-time ledger over a time range, by cause, job, user, "
            "account, team or cluster")
def read_fleet_ledger(session: SessionDep, settings: SettingsDep, group_by: GroupBy = "cause",
                      start: TimeQ = None, end: TimeQ = None, cluster: ClusterFilter = None,
                      limit: Annotated[int | None, Query(ge=1, le=10_000, description="the most wasteful groups "
                                                         "only; the rest summed in omitted")] = None) -> Any:
    t1 = parse_time(end, name="end") or now()
    t0 = parse_time(start, name="start")
    return fleet_ledger(session, group_by=group_by, start=t0 if t0 is not None else t1 - 86400, end=t1,
                        cluster=cluster, cost=settings.cost, limit=limit)
