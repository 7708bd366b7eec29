"""The deployment page (/deployments/{name}): SLO attainment over time, p99 latency against the
SLO lines, tokens per GPU-second and KV use, the replicas and their GPUs, and the serving findings
(docs/serving.md). The pages' one shell (api/web.py ``_shell``: navigation with Silences, search,
session) and app.js's routing, which hands the page to api/static/deployment.js; it reads only
GET /api/v1/deployments/{name}."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import HTMLResponse

from .web import _shell

router = APIRouter(include_in_schema=False)


@router.get("/deployments/{name}", response_class=HTMLResponse)
def deployment_page(request: Request, name: Annotated[str, Path(max_length=253)],
                    cluster: Annotated[str | None, Query(max_length=128)] = None) -> HTMLResponse:
    return _shell(request, "deployment", f"Deployment {name}", {"name": name, "cluster": cluster or ""})
