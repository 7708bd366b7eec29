"""/api/v1/fleet/summary, /api/v1/flags, /api/v1/flag-kinds and /api/v1/catalog."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request

from gpufleet.analysis.progress.load import fleet_goodput
from gpufleet.catalog import CATALOG
from gpufleet.flagkinds import SEVERITIES, flag_kinds

from .metrics import TimedRoute
from .queries.common import parse_duration
from .queries.fleet import TTLCache, fleet_summary, list_flags
from .routes_common import ClusterFilter, Cursor, SessionDep
from .routes_jobs import FlagKind
from .schemas import FlagsPublic, FleetSummary, Message

Severity = Literal[SEVERITIES]  # type: ignore[valid-type]  # the registry's severities
router = APIRouter(prefix="/api/v1", tags=["fleet"], route_class=TimedRoute,
                   responses={400: {"model": Message, "description": "an argument is invalid (detail says which)"}})


@router.get("/fleet/summary", response_model=FleetSummary,
            summary="Fleet activity, wasted GPU-hours by cause, top wasting jobs and users")
def read_fleet_summary(session: SessionDep, request: Request, cluster: ClusterFilter = None,
                       window: Annotated[str, Query(max_length=16, pattern=r"^\s*\d+(\.\d+)?\s*[smhdw]?\s*$",
                                                    description="duration: 30m, 24h, 7d (max 90d)")] = "24h") -> Any:
    cache = getattr(request.app.state, "api_fleet_cache", None)
    if cache is None:
        cache = request.app.state.api_fleet_cache = TTLCache(ttl_s=60.0)
    out = fleet_summary(session, window_s=parse_duration(window), cluster=cluster, cache=cache)
    return {**out, "goodput": fleet_goodput(session, out["start"], out["end"])}  # docs/progress.md


@router.get("/flags", response_model=FlagsPublic,
            summary="Goodput flags, most severe first, most wasteful within a severity")
def read_flags(session: SessionDep, open: bool | None = None, kind: FlagKind | None = None,
               severity: Severity | None = None, cluster: ClusterFilter = None,
               limit: Annotated[int, Query(ge=1, le=500)] = 100, cursor: Cursor = None,
               sort: Annotated[Literal["severity", "waste"],
                               Query(description="severity (then waste; the default) or waste alone")] = "severity",
               ) -> Any:
    return list_flags(session, open_=open, kind=kind, severity=severity, cluster=cluster, limit=limit, cursor=cursor,
                      sort=sort)


@router.get("/catalog", summary="The metric catalog: every per-GPU field with unit and description")
def read_catalog() -> dict[str, Any]:
    return {"data": [{"name": f.name, "unit": f.unit, "min": f.min, "max": f.max, "rollup": f.rollup,
                      "description": f.description} for f in CATALOG.fields], "count": len(CATALOG.fields)}


@router.get("/flag-kinds", summary="The flag-kind registry: titles, scopes, severities, suggestions, evidence labels")
def read_flag_kinds() -> dict[str, Any]:
    # The web page and any client read titles and evidence units from here (one home:
    # gpufleet/flagkinds.toml), so a new kind shows up without a front-end change.
    return flag_kinds().as_json()
