"""The REST API router (mounted by gpufleet.server): every /api/v1 read endpoint plus
/healthz, /readyz and /metrics. Reads need a viewer token unless anonymous access is on."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, FastAPI

from . import (
    routes_collectives,
    routes_fleet,
    routes_jobs,
    routes_ledger,
    routes_nodes,
    routes_ops,
    routes_progress,
    routes_serving,
)
from .deps import require_viewer
from .metrics import metrics_for
from .schemas import Message

router = APIRouter()
_viewer = [Depends(require_viewer)]
_auth_errors: dict[int | str, dict[str, Any]] = {
    401: {"model": Message, "description": "no, unknown or revoked token (and anonymous access is off)"},
    403: {"model": Message, "description": "the token's role may not read (agent tokens only write)"},
}
# routes_collectives, routes_progress, routes_ledger first: routes_jobs' /{job_id:path} would take their suffixes.
for part in (routes_collectives, routes_progress, routes_ledger, routes_jobs, routes_nodes, routes_fleet,
             routes_serving):
    router.include_router(part.router, dependencies=_viewer, responses=_auth_errors)
router.include_router(routes_ops.router)


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    m = metrics_for(app)  # create the per-app registry before the first scrape
    yield
    if m.shared is not None:
        m.shared.stop()
