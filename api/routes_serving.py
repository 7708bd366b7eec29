"""GET /api/v1/deployments and /api/v1/deployments/{name}: serving deployments judged by the requests
they serve within their SLOs (docs/serving.md). Thin: api/queries/serving.py does the work."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Query

from .deps import SettingsDep
from .metrics import TimedRoute
from .queries.common import now, parse_time
from .queries.serving import list_deployments, one_deployment
from .routes_common import ClusterFilter, SessionDep
from .schemas import Message

router = APIRouter(prefix="/api/v1", tags=["serving"], route_class=TimedRoute,
                   responses={400: {"model": Message, "description": "an argument is invalid (detail says which)"}})
TimeQ = Annotated[str | None, Query(max_length=40, description="epoch seconds, ISO-8601 (UTC) or -1h")]
MAX_SPAN_S = 7 * 86400


def _range(start: str | None, end: str | None) -> tuple[int, int]:
    t1 = parse_time(end, name="end") or now()
    t0 = parse_time(start, name="start")
    t0 = t1 - 3600 if t0 is None else t0
    if t1 <= t0:
        raise HTTPException(400, "end must be after start")
    if t1 - t0 > MAX_SPAN_S:
        raise HTTPException(400, f"at most {MAX_SPAN_S // 86400} days at once: narrow start/end")
    return int(t0 // 60 * 60), int(-(-t1 // 60) * 60)


@router.get("/deployments", summary="Serving deployments: rates per GPU, latency percentiles, SLO attainment, "
            "goodput and cost per million SLO-meeting tokens (default: the last hour)")
def read_deployments(session: SessionDep, settings: SettingsDep, start: TimeQ = None, end: TimeQ = None,
                     cluster: ClusterFilter = None) -> Any:
    t0, t1 = _range(start, end)
    return list_deployments(session, t0, t1, cluster, settings.cost)


@router.get("/deployments/{name}", summary="One deployment: its summary, SLO attainment minute by minute, its "
            "replicas and their GPUs, and the serving findings with their fixes",
            responses={404: {"model": Message, "description": "no minutes of that deployment in the range"}})
def read_deployment(session: SessionDep, settings: SettingsDep,
                    name: Annotated[str, Path(max_length=253)], start: TimeQ = None, end: TimeQ = None,
                    cluster: ClusterFilter = None) -> Any:
    t0, t1 = _range(start, end)
    found = one_deployment(session, name, t0, t1, cluster, settings.cost)
    if found is None:
        raise HTTPException(404, f"no minutes of deployment {name!r} between {t0} and {t1}")
    return found
