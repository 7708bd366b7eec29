"""The web dashboard, served by the same app: small HTML shells per page, one script and one
stylesheet from api/static, and uPlot's built files served from the installed ``uplot-python``
package (never copied into this repository).

Pages render client-side from the REST API. The script builds every node with
``textContent``/attributes, never ``innerHTML``, so user-controlled strings (job names, users,
labels) stay text; the only server-side values in the shells go through ``html.escape``."""

from __future__ import annotations

import functools
import html
import json
import threading
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi import Path as PathParam
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import FileResponse, HTMLResponse, Response
from sqlalchemy import select

from gpufleet import __version__

from .deps import require_viewer
from .routes_common import SessionDep

STATIC = Path(__file__).with_name("static")
OWN_FILES = {"app.js": "text/javascript", "dom.js": "text/javascript", "fmt.js": "text/javascript",
             "app.css": "text/css",
             "favicon.svg": "image/svg+xml",
             "collectives.js": "text/javascript", "goodput.js": "text/javascript",
             "replay.js": "text/javascript", "pages.css": "text/css", "fleet.js": "text/javascript",
             "search.js": "text/javascript", "xid.js": "text/javascript", "gpu.js": "text/javascript",
             "charts.js": "text/javascript", "heatmap.js": "text/javascript", "job.js": "text/javascript",
             "evidence.js": "text/javascript", "events.js": "text/javascript", "node.js": "text/javascript",
             "evidence.css": "text/css", "deployment.js": "text/javascript"}
UPLOT_FILES = {"uPlot.iife.min.js": "text/javascript", "uPlot.iife.js": "text/javascript",
               "uPlot.min.css": "text/css"}
# Swagger UI and ReDoc from the installed ``fastapi-offline`` package (never copied here).
APIDOCS_FILES = {"swagger-ui-bundle.js": "text/javascript", "swagger-ui.css": "text/css",
                 "redoc.standalone.js": "text/javascript"}
# Same-origin only: no inline script, no third-party hosts. uPlot sets inline styles.
CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
       "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'")

router = APIRouter(include_in_schema=False)


def _uplot_dir() -> Path:
    import uplot

    return Path(uplot.__file__).with_name("static")


def _uplot_js() -> str:
    d = _uplot_dir()
    return "uPlot.iife.min.js" if (d / "uPlot.iife.min.js").exists() else "uPlot.iife.js"


def _shell(request: Request, page: str, title: str, args: dict[str, str]) -> HTMLResponse:
    settings = request.app.state.settings
    cost = settings.cost
    cfg = {"page": page, "args": args, "grafana": bool(settings.grafana.url), "version": __version__,
           "cost": {"price": cost.gpu_hour_price, "by_cluster": cost.gpu_hour_price_by_cluster,
                    "currency": cost.currency}}
    nav = "".join(f'<a href="{href}"{" class=on" if key == page else ""}>{label}</a>'
                  for key, href, label in (("fleet", "/", "Fleet"), ("jobs", "/jobs", "Jobs"),
                                           ("flags", "/flags", "Flags"), ("silences", "/silences", "Silences")))
    body = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)} · gpufleet</title>
<link rel="icon" href="/favicon.ico" type="image/svg+xml">
<link rel="stylesheet" href="/static/uplot/uPlot.min.css">
<link rel="stylesheet" href="/static/app.css?v={__version__}">
<link rel="stylesheet" href="/static/pages.css?v={__version__}">
<link rel="stylesheet" href="/static/evidence.css?v={__version__}">
</head><body>
<header><a class="brand" href="/">gpufleet</a><nav>{nav}</nav><span id="status" class="muted"></span></header>
<main id="app" data-config="{html.escape(json.dumps(cfg), quote=True)}"><p class="muted">Loading…</p></main>
<script src="/static/uplot/{_uplot_js()}"></script>
<script src="/static/dom.js?v={__version__}"></script>
<script src="/static/fmt.js?v={__version__}"></script>
<script src="/static/evidence.js?v={__version__}"></script>
<script src="/static/auth/session.js?v={__version__}"></script>
<script src="/static/collectives.js?v={__version__}"></script>
<script src="/static/goodput.js?v={__version__}"></script>
<script src="/static/fleet.js?v={__version__}"></script>
<script src="/static/xid.js?v={__version__}"></script>
<script src="/static/gpu.js?v={__version__}"></script>
<script src="/static/charts.js?v={__version__}"></script>
<script src="/static/heatmap.js?v={__version__}"></script>
<script src="/static/job.js?v={__version__}"></script>
<script src="/static/events.js?v={__version__}"></script>
<script src="/static/node.js?v={__version__}"></script>
<script src="/static/deployment.js?v={__version__}"></script>
<script src="/static/app.js?v={__version__}"></script>
<script src="/static/search.js?v={__version__}"></script>
<script src="/static/replay.js?v={__version__}"></script>
</body></html>"""
    return HTMLResponse(body, headers={"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
                                       "Cache-Control": "no-cache"})


class ReplayProgress:
    """How far ``gpufleet up``'s simulated agents are through replaying their past, so the page
    shows "replaying history: N%" instead of looking empty while the first charts fill.
    Agents (threads) add the cycles they will replay, then count them off; ``up`` puts the
    object on ``app.state.replay``. No object there (``serve``, a real fleet): nothing to show."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.total = 0
        self.done = 0

    def plan(self, cycles: int) -> None:
        with self._lock:
            self.total += cycles

    def step(self, cycles: int = 1) -> None:
        with self._lock:
            self.done = min(self.total, self.done + cycles)

    def as_json(self) -> dict[str, object]:
        with self._lock:
            total, done = self.total, self.done
        active = total > 0 and done < total
        return {"active": active, "percent": round(100.0 * done / total, 1) if total else None,
                "cycles_done": done, "cycles_total": total}


@router.get("/web/replay")
def replay_status(request: Request) -> dict[str, object]:
    progress: ReplayProgress | None = getattr(request.app.state, "replay", None)
    if progress is None:
        return {"active": False, "percent": None, "cycles_done": 0, "cycles_total": 0}
    return progress.as_json()


XID_ACTIONS = {"RESTART_APP": "restart the application", "RESET_GPU": "reset the GPU (drain it first)",
               "RESTART_BM": "reboot the node", "CONTACT_SUPPORT": "contact NVIDIA support",
               "IGNORE": "no action by itself"}
XID_ORIGINS = {"application", "driver", "hardware", "fabric"}


@functools.cache
def xid_table() -> dict[int, dict[str, str]]:
    """gpufleet/xid.toml by code, checked: a malformed entry fails loudly at first use."""
    import tomllib

    from gpufleet import __file__ as pkg_file

    path = Path(pkg_file).with_name("xid.toml")  # packaged beside gpufleet/__init__.py
    out: dict[int, dict[str, str]] = {}
    for e in tomllib.loads(path.read_text())["xid"]:
        code, action, origin = e["code"], e["action"], e["origin"]
        if not isinstance(code, int) or code in out or action not in XID_ACTIONS or origin not in XID_ORIGINS:
            raise ValueError(f"{path}: bad [[xid]] entry {e!r}")
        out[code] = {"meaning": str(e["meaning"]), "action": XID_ACTIONS[action], "origin": origin}
    return out


@router.get("/web/xid")
def xid_codes() -> dict[str, object]:
    """NVIDIA's XID meanings (gpufleet/xid.toml) for the pages that show events."""
    return {"data": {str(k): v for k, v in sorted(xid_table().items())}}


@router.get("/web/search", dependencies=[Depends(require_viewer)])
def search(session: SessionDep, q: Annotated[str, Query(min_length=1, max_length=255)]) -> dict[str, object]:
    """The header's search box: a job id, a node name, a GPU UUID or a user, straight to its page.
    Exact matches only (ids are typed or pasted); ``href`` None when nothing or several match,
    with no error status, so the page can say so without a failed request in the console."""
    from urllib.parse import quote, urlencode

    from gpufleet.storage.models import Cluster, Gpu, Job, Node

    q = q.strip()
    hits: list[dict[str, str]] = []
    for job_id, cluster in session.execute(select(Job.job_id, Cluster.name).join(Cluster, Cluster.id == Job.cluster_id)
                                           .where(Job.job_id == q).limit(10)):
        hits.append({"kind": "job", "label": f"job {job_id} ({cluster})",
                     "href": f"/jobs/{quote(job_id, safe='/')}?{urlencode({'cluster': cluster})}"})
    for name, cluster in session.execute(select(Node.name, Cluster.name).join(Cluster, Cluster.id == Node.cluster_id)
                                         .where(Node.name == q).limit(10)):
        hits.append({"kind": "node", "label": f"node {name} ({cluster})",
                     "href": f"/nodes/{quote(name, safe='')}?{urlencode({'cluster': cluster})}"})
    for uuid, name, cluster in session.execute(select(Gpu.uuid, Node.name, Cluster.name)
                                               .join(Node, Node.id == Gpu.node_id)
                                               .join(Cluster, Cluster.id == Node.cluster_id)
                                               .where(Gpu.uuid == q).limit(1)):
        hits.append({"kind": "gpu", "label": f"GPU {uuid} on {name}",
                     "href": f"/nodes/{quote(name, safe='')}?{urlencode({'cluster': cluster})}"})
    if session.execute(select(Job.id).where(Job.user == q).limit(1)).first():
        hits.append({"kind": "user", "label": f"jobs of user {q}", "href": f"/jobs?{urlencode({'user': q})}"})
    return {"q": q, "href": hits[0]["href"] if len(hits) == 1 else None, "matches": hits}


Name = Annotated[str, PathParam(max_length=255)]
ClusterQ = Annotated[str, Query(max_length=128)]


@router.get("/", response_class=HTMLResponse)
def fleet_page(request: Request) -> HTMLResponse:
    return _shell(request, "fleet", "Fleet", {})


@router.get("/jobs", response_class=HTMLResponse)
def jobs_page(request: Request) -> HTMLResponse:
    return _shell(request, "jobs", "Jobs", {})


@router.get("/flags", response_class=HTMLResponse)
def flags_page(request: Request) -> HTMLResponse:
    return _shell(request, "flags", "Flags", {})


@router.get("/jobs/{job_id:path}", response_class=HTMLResponse)  # k8s ids are "namespace/pod"
def job_page(request: Request, job_id: Name, cluster: ClusterQ = "default") -> HTMLResponse:
    return _shell(request, "job", f"Job {job_id}", {"job_id": job_id, "cluster": cluster})


@router.get("/nodes/{name:path}", response_class=HTMLResponse)
def node_page(request: Request, name: Name, cluster: ClusterQ = "default") -> HTMLResponse:
    return _shell(request, "node", f"Node {name}", {"name": name, "cluster": cluster})


def _apidocs_dir() -> Path:
    import fastapi_offline

    return Path(fastapi_offline.__file__).with_name("static")


@router.get("/docs", response_class=HTMLResponse)
def swagger_ui(request: Request) -> HTMLResponse:
    # FastAPI's default pages pull Swagger UI from a CDN; clusters are often air-gapped.
    return get_swagger_ui_html(openapi_url=request.app.openapi_url, title="gpufleet API",
                               swagger_js_url="/static/apidocs/swagger-ui-bundle.js",
                               swagger_css_url="/static/apidocs/swagger-ui.css",
                               swagger_favicon_url="/favicon.ico",
                               oauth2_redirect_url="/docs/oauth2-redirect")


@router.get("/docs/oauth2-redirect", response_class=HTMLResponse)
def swagger_ui_redirect() -> HTMLResponse:
    return get_swagger_ui_oauth2_redirect_html()


@router.get("/redoc", response_class=HTMLResponse)
def redoc(request: Request) -> HTMLResponse:
    # with_google_fonts=False: the default page links fonts.googleapis.com
    return get_redoc_html(openapi_url=request.app.openapi_url, title="gpufleet API",
                          redoc_js_url="/static/apidocs/redoc.standalone.js",
                          redoc_favicon_url="/favicon.ico", with_google_fonts=False)


# ReDoc's sidebar fetches its vendor's logo from a CDN at run time (no option turns it off):
# offline that is a failed request per page view, so the served copy points it at our favicon.
REDOC_CDN_LOGO = b"https://cdn.redoc.ly/redoc/logo-mini.svg"


@functools.cache
def _redoc_js() -> bytes:
    return (_apidocs_dir() / "redoc.standalone.js").read_bytes().replace(REDOC_CDN_LOGO, b"/favicon.ico")


@router.get("/static/apidocs/{name}")
def apidocs_file(name: str) -> Response:
    if name not in APIDOCS_FILES:
        raise HTTPException(404, "not found")
    if name == "redoc.standalone.js":
        return Response(_redoc_js(), media_type=APIDOCS_FILES[name],
                        headers={"Cache-Control": "public, max-age=86400"})
    return FileResponse(_apidocs_dir() / name, media_type=APIDOCS_FILES[name],
                        headers={"Cache-Control": "public, max-age=86400"})


@router.get("/gpus/{uuid}", response_class=HTMLResponse)
def gpu_page(request: Request, uuid: Annotated[str, PathParam(max_length=96)]) -> HTMLResponse:
    return _shell(request, "gpu", f"GPU {uuid}", {"uuid": uuid})


@router.get("/favicon.ico")
def favicon() -> FileResponse:
    return FileResponse(STATIC / "favicon.svg", media_type="image/svg+xml",
                        headers={"Cache-Control": "public, max-age=86400"})


@router.get("/static/uplot/{name}")
def uplot_file(name: str) -> Response:
    if name not in UPLOT_FILES or not (_uplot_dir() / name).exists():
        raise HTTPException(404, "not found")
    return FileResponse(_uplot_dir() / name, media_type=UPLOT_FILES[name],
                        headers={"Cache-Control": "public, max-age=86400"})


@router.get("/static/{name}")
def static_file(name: str) -> Response:
    if name not in OWN_FILES:
        raise HTTPException(404, "not found")
    return FileResponse(STATIC / name, media_type=OWN_FILES[name], headers={"Cache-Control": "no-cache"})
