"""The deployment page (/deployments/{name}): SLO attainment over time, p99 latency against the
SLO lines, tokens per GPU-second and KV use, the replicas and their GPUs, and the serving findings
(docs/serving.md). Its own shell and script (api/static/deployment.js), reading only
GET /api/v1/deployments/{name}; the shared scripts (dom.js, fmt.js, charts.js, uPlot) as the other
pages load them. Server-side values enter the shell through ``html.escape`` only."""

from __future__ import annotations

import html
import json
from typing import Annotated

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import FileResponse, HTMLResponse, Response

from gpufleet import __version__

from .web import CSP, STATIC, _uplot_js

router = APIRouter(include_in_schema=False)


@router.get("/deployments/{name}", response_class=HTMLResponse)
def deployment_page(request: Request, name: Annotated[str, Path(max_length=253)],
                    cluster: Annotated[str | None, Query(max_length=128)] = None) -> HTMLResponse:
    cfg = json.dumps({"page": "deployment", "args": {"name": name, "cluster": cluster}, "version": __version__})
    v = __version__
    body = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Deployment {html.escape(name)} · gpufleet</title>
<link rel="icon" href="/favicon.ico" type="image/svg+xml">
<link rel="stylesheet" href="/static/uplot/uPlot.min.css">
<link rel="stylesheet" href="/static/app.css?v={v}">
<link rel="stylesheet" href="/static/pages.css?v={v}">
</head><body>
<header><a class="brand" href="/">gpufleet</a><nav><a href="/">Fleet</a><a href="/jobs">Jobs</a>
<a href="/flags">Flags</a></nav><span id="status" class="muted"></span></header>
<main id="app" data-config="{html.escape(cfg, quote=True)}"><p class="muted">Loading…</p></main>
<script src="/static/uplot/{_uplot_js()}"></script>
<script src="/static/dom.js?v={v}"></script>
<script src="/static/fmt.js?v={v}"></script>
<script src="/static/charts.js?v={v}"></script>
<script src="/static/serving/deployment.js?v={v}"></script>
</body></html>"""
    return HTMLResponse(body, headers={"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
                                       "Cache-Control": "no-cache"})


@router.get("/static/serving/deployment.js")
def deployment_js() -> Response:
    return FileResponse(STATIC / "deployment.js", media_type="text/javascript", headers={"Cache-Control": "no-cache"})
