"""/api/v1/jobs: list, detail (JSON or per-GPU CSV), time series."""

from __future__ import annotations

import csv
import io
from typing import Annotated, Any, Literal
from urllib.parse import quote, urlencode

import msgspec
from fastapi import APIRouter, Header, HTTPException, Query, Response

from gpufleet.analysis.progress.load import goodput_view
from gpufleet.flagkinds import FLAG_KINDS

from .deps import SettingsDep
from .metrics import TimedRoute
from .queries.common import DEFAULT_CLUSTER, now, parse_time
from .queries.job_timeline import job_timeline, previous_runs
from .queries.jobs import find_job, job_detail, list_jobs
from .queries.per_gpu_ledger import LEDGER_COLUMNS, with_ledger
from .queries.timeseries import job_timeseries, parse_fields
from .routes_common import SAFE, ClusterFilter, ClusterQ, Cursor, JobIdPath, SessionDep, Text
from .schemas import JobPublic, JobsPublic, Message, TimeseriesPublic

router = APIRouter(prefix="/api/v1/jobs", tags=["jobs"], route_class=TimedRoute,
                   responses={400: {"model": Message, "description": "an argument is invalid (detail says which)"}})

# The OpenAPI enum of flag kinds, from the registry (gpufleet/flagkinds.toml), never a copy.
FlagKind = Literal[FLAG_KINDS]  # type: ignore[valid-type]  # built from data at import
TimeQ = Annotated[str | None, Query(max_length=64, pattern=SAFE,
                                    description="epoch seconds, ISO-8601 (UTC if naive) or a past offset like -24h")]
FIELDS_DOC = "comma-separated catalog fields (default: sm_active,tensor_active,dram_active,power_w,sm_clock_mhz)"
PER_GPU_COLUMNS = ("gpu_uuid", "node", "index", "sm_active_mean", "tensor_active_mean", "dram_active_mean",
                   "power_w_mean", "sm_clock_mhz_mean", "fb_used_bytes_max", *LEDGER_COLUMNS)


@router.get("", response_model=JobsPublic, summary="List jobs (filter, sort, cursor pagination)")
def read_jobs(
    session: SessionDep,
    cluster: ClusterFilter = None,
    user: Text = None,
    state: Literal["running", "ended"] | None = None,
    flag: Annotated[FlagKind | None, Query(description="jobs that have (or had) a flag of this kind")] = None,
    since: TimeQ = None,
    until: TimeQ = None,
    sort: Annotated[Literal["waste", "start", "gpus"], Query(description="wasted GPU-hours, start time or GPUs")]
    = "start",
    order: Literal["asc", "desc"] = "desc",
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Cursor = None,
) -> Any:
    return list_jobs(session, cluster=cluster, user=user, state=state, flag=flag,
                     since=parse_time(since, name="since"), until=parse_time(until, name="until"),
                     sort=sort, order=order, limit=limit, cursor=cursor)


def grafana_link(base: str, cluster: str, job_pk: int, job: dict[str, Any]) -> str:
    # dashboards/json/gpufleet-job.json: uid "gpufleet-job"; its "job" variable's value is
    # the job's primary key (its text shows the job id), "cluster" the cluster name.
    start = job.get("start_ts") or now() - 3600
    end = job.get("end_ts")
    q = {"var-cluster": cluster, "var-job": job_pk, "from": int(start * 1000),
         "to": int(end * 1000) if end else "now"}
    return f"{base.rstrip('/')}/d/gpufleet-job/gpufleet-job?{urlencode(q)}"


def per_gpu_csv(rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(PER_GPU_COLUMNS)
    for r in rows:
        # A leading = + - @ would make a spreadsheet evaluate the cell; quote it as text.
        w.writerow(["'" + v if isinstance(v, str) and v[:1] in "=+-@" else v
                    for v in (r.get(c) for c in PER_GPU_COLUMNS)])
    return buf.getvalue()


# Job ids may hold "/" (Kubernetes jobs are "namespace/pod"), hence the path converters;
# the time-series route is declared first so ".../timeseries" is not read as part of an id.
@router.get("/{job_id:path}/timeseries", response_model=TimeseriesPublic,
            summary="Per-GPU and job-aggregate series, downsampled on the server from 1-minute rollups",
            responses={404: {"description": "no such job"}})
def read_job_timeseries(
    job_id: JobIdPath, session: SessionDep,
    cluster: ClusterQ = DEFAULT_CLUSTER,
    fields: Annotated[str | None, Query(max_length=1024, pattern=SAFE, description=FIELDS_DOC)] = None,
    gpu: Annotated[str | None, Query(max_length=4096, pattern=SAFE,
                                     description="comma-separated GPU UUIDs; empty = every GPU; none = aggregate only")]
    = None,
    step: Annotated[str, Query(max_length=16, pattern=r"^(auto|\d{1,8})$",
                               description="auto (about 360 points) or seconds (>= 60)")] = "auto",
    start: TimeQ = None,
    end: TimeQ = None,
    points: Annotated[int | None, Query(ge=10, le=5000, description="with step=auto: aim at about this many "
                                                                   "points (a chart's width); default 360")] = None,
) -> Any:
    found = find_job(session, cluster, job_id)
    if found is None:
        raise HTTPException(404, f"no job {job_id!r} in cluster {cluster!r}")
    gpus: list[str] | None = None
    if gpu == "none":
        gpus = []
    elif gpu:
        gpus = [g.strip() for g in gpu.split(",") if g.strip()] or None
    body = job_timeseries(session, found[0], fields=parse_fields(fields), gpus=gpus, step=step,
                          start=parse_time(start, name="start"), end=parse_time(end, name="end"), points=points)
    # Tens of thousands of floats: msgspec encodes them ~10x faster than the default path
    # (and writes NaN gaps as null).
    return Response(msgspec.json.encode(body), media_type="application/json")


@router.get("/{job_id:path}/timeline", summary="What the job page draws beside the series: events, capacities, "
            "clock-reason bits", responses={404: {"description": "no such job"}})
def read_job_timeline(job_id: JobIdPath, session: SessionDep, cluster: ClusterQ = DEFAULT_CLUSTER) -> Any:
    found = find_job(session, cluster, job_id)
    if found is None:
        raise HTTPException(404, f"no job {job_id!r} in cluster {cluster!r}")
    return job_timeline(session, found[0])


@router.get("/{job_id:path}/previous-runs", summary="Earlier jobs of the same name in the same cluster, newest first",
            responses={404: {"description": "no such job"}})
def read_previous_runs(job_id: JobIdPath, session: SessionDep, cluster: ClusterQ = DEFAULT_CLUSTER,
                       limit: Annotated[int, Query(ge=1, le=50)] = 10) -> Any:
    found = find_job(session, cluster, job_id)
    if found is None:
        raise HTTPException(404, f"no job {job_id!r} in cluster {cluster!r}")
    return {"name": found[0].name, "data": previous_runs(session, found[0], found[1], limit=limit)}


@router.get("/{job_id:path}", response_model=JobPublic, summary="One job: metadata, GPUs, report, flags",
            responses={200: {"content": {"text/csv": {"schema": {"type": "string"}}},
                             "description": "JSON, or with Accept: text/csv the per-GPU report"},
                       404: {"description": "no such job"}})
def read_job(job_id: JobIdPath, session: SessionDep, settings: SettingsDep,
             cluster: ClusterQ = DEFAULT_CLUSTER,
             format: Annotated[Literal["json", "csv"] | None,
                               Query(description="csv = per-GPU report (same as Accept: text/csv)")] = None,
             accept: Annotated[str | None, Header(max_length=512)] = None) -> Any:
    found = find_job(session, cluster, job_id)
    if found is None:
        raise HTTPException(404, f"no job {job_id!r} in cluster {cluster!r}")
    detail = job_detail(session, *found)
    detail["goodput"] = goodput_view(session, found[0].id, now())  # docs/progress.md
    wants_csv = format == "csv" or (format is None and accept is not None and "text/csv" in accept
                                    and "application/json" not in accept)
    if wants_csv:
        name = quote(f"{cluster}-{job_id}-gpus.csv", safe="")
        rows = with_ledger(detail["per_gpu"], detail["report"])  # the ledger's columns per GPU
        return Response(per_gpu_csv(rows), media_type="text/csv; charset=utf-8",
                        headers={"Content-Disposition": f"attachment; filename*=UTF-8''{name}"})
    links = {"web": f"/jobs/{quote(job_id, safe='')}?{urlencode({'cluster': cluster})}",
             "timeseries": f"/api/v1/jobs/{quote(job_id, safe='')}/timeseries?{urlencode({'cluster': cluster})}"}
    if settings.grafana.url:
        links["grafana"] = grafana_link(settings.grafana.url, cluster, found[0].id, detail)
    return {**detail, "links": links}
