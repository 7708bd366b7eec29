"""/healthz (process up), /readyz (database answers), /metrics (this app's Prometheus registry)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST
from sqlalchemy import text
from starlette.concurrency import run_in_threadpool

from .metrics import TimedRoute, metrics_for

router = APIRouter(tags=["ops"], route_class=TimedRoute)


@router.get("/healthz", summary="Liveness: the process answers")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", summary="Readiness: the database answers a query",
            responses={503: {"description": "database unreachable"}})
async def readyz(request: Request) -> Response:
    def ping() -> None:
        with request.app.state.engine.connect() as c:
            c.execute(text("select 1"))

    try:
        await run_in_threadpool(ping)
    except Exception as e:  # any failure to reach the DB means not ready; say which
        return JSONResponse({"status": "unavailable", "detail": f"database: {type(e).__name__}"}, status_code=503)
    return JSONResponse({"status": "ok"})


@router.get("/metrics", summary="Prometheus metrics of this service", response_class=Response)
async def metrics(request: Request) -> Response:
    body = await run_in_threadpool(metrics_for(request.app).exposition)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
