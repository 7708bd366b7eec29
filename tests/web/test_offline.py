"""Air-gapped clusters: no page gpufleet serves (the dashboard, Swagger UI at /docs, ReDoc at
/redoc) may request anything from another origin, and none may log a console error. Every request
the browser makes is recorded, so a CDN link added anywhere later fails here."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import pytest
from apiseed import Seeded
from webpage import Page

pytestmark = pytest.mark.browser

DASHBOARD = ["/", "/jobs", "/flags", "/jobs/1001", "/jobs/1002", "/nodes/node-b"]


def _foreign(p: Page) -> list[str]:
    own = urlsplit(p.base).netloc
    return [u for u in p.requests if urlsplit(u).scheme in ("http", "https", "ws", "wss")
            and urlsplit(u).netloc != own]


def _record(p: Page) -> None:
    p.requests = []
    p.page.on("request", lambda r: p.requests.append(r.url))


def test_dashboard_pages_stay_on_their_own_origin(web: tuple[Page, Seeded]) -> None:
    p, _ = web
    _record(p)
    for path in DASHBOARD:
        p.open(path)
        p.page.wait_for_load_state("networkidle")
    assert len(p.requests) > 3 * len(DASHBOARD)  # the recorder saw the pages' API calls
    assert _foreign(p) == []
    assert p.errors == []


def test_swagger_ui_renders_offline(web: tuple[Page, Seeded]) -> None:
    p, _ = web
    _record(p)
    pg: Any = p.page
    pg.goto(p.base + "/docs")
    pg.wait_for_selector(".swagger-ui .info .title")
    assert "gpufleet" in pg.locator(".swagger-ui .info .title").inner_text()
    pg.wait_for_selector(".opblock")  # operations rendered from /openapi.json
    assert pg.locator(".opblock").count() > 10
    pg.wait_for_load_state("networkidle")
    assert any(u.endswith("/static/apidocs/swagger-ui-bundle.js") for u in p.requests)
    assert _foreign(p) == []
    assert p.errors == []
    p.shot("docs-swagger")


def test_redoc_renders_offline(web: tuple[Page, Seeded]) -> None:
    p, _ = web
    _record(p)
    pg: Any = p.page
    pg.goto(p.base + "/redoc")
    pg.wait_for_selector("h1")
    assert "gpufleet" in pg.locator("h1").first.inner_text()
    pg.wait_for_load_state("networkidle")
    assert any(u.endswith("/static/apidocs/redoc.standalone.js") for u in p.requests)
    assert _foreign(p) == []
    assert p.errors == []
    p.shot("docs-redoc")


def test_docs_assets_are_served_and_unknown_names_are_not(web: tuple[Page, Seeded]) -> None:
    p, _ = web
    req = p.page.context.request
    for name in ("swagger-ui-bundle.js", "swagger-ui.css", "redoc.standalone.js"):
        r = req.get(f"{p.base}/static/apidocs/{name}")
        assert r.status == 200 and len(r.body()) > 10_000, name
    assert req.get(f"{p.base}/static/apidocs/..%2Fcore.py").status == 404
    assert req.get(f"{p.base}/static/apidocs/favicon.png").status == 404
