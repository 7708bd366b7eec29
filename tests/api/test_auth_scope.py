"""Issue 38 items 9 and 11 (the reading side), over real HTTP against the real app on SQLite
and PostgreSQL: ``next=`` after sign-in only to same-origin paths; a viewer token created with
``--cluster`` reads only that cluster on every read endpoint (others refused, fail closed), and
operator/admin tokens refuse ``--cluster``; wrong sign-ins are throttled per source."""

from __future__ import annotations

import html
import re
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest
import sqlalchemy as sa

from gpufleet.storage.db import make_engine
from gpufleet.storage.tokens import create_token

# What an attacker puts after /signin?next= (raw query text): each must land on "/" after sign-in.
HOSTILE_NEXT = [
    "/%09/other-host/x",  # the finding: browsers drop the tab, leaving //other-host/x
    "/%0a/other-host/x", "/%0d/other-host/x", "%09//other-host/x",
    "//evil.example/x", "/%2F/evil.example/x", "%2F%2Fevil.example",
    "/\\evil.example", "/%5Cevil.example", "%5C%5Cevil.example",
    "https://evil.example/", "https:%2F%2Fevil.example", "javascript:alert(1)", "java%0ascript:alert(1)",
    "%20//evil.example", "/%20/evil.example".replace("%20", "%00"), "http:evil.example",
]
SAFE_NEXT = {"/jobs": "/jobs", "/jobs%3Fstate%3Drunning": "/jobs?state=running", "/node/n1": "/node/n1",
             "/a/b?c=1%26d=%2F%2Fx": "/a/b?c=1&d=//x"}


def _data_next(page: str) -> str:
    m = re.search(r'data-next="([^"]*)"', page)
    assert m is not None, page[:500]
    return html.unescape(m.group(1))


def test_safe_next_rules() -> None:
    from gpufleet.api.auth.redirects import safe_next

    assert safe_next("/jobs?x=1") == "/jobs?x=1"
    for bad in ("/\t/other-host/x", "//evil", "/\\evil", "https://evil", "\\\\evil", " /x", "/x\n", "", "jobs"):
        assert safe_next(bad) == "/", repr(bad)


@pytest.mark.parametrize("raw", HOSTILE_NEXT)
def test_signin_next_never_leaves_the_origin(database_url: str, live_server, raw: str) -> None:  # type: ignore[no-untyped-def]
    srv = live_server(database_url, allow_anonymous=False)
    r = httpx.get(f"{srv.url}/signin?next={raw}", timeout=10)
    assert r.status_code == 200
    assert _data_next(r.text) == "/", (raw, _data_next(r.text))


def test_signin_next_keeps_same_origin_paths(database_url: str, live_server) -> None:  # type: ignore[no-untyped-def]
    srv = live_server(database_url, allow_anonymous=False)
    for raw, want in SAFE_NEXT.items():
        assert _data_next(httpx.get(f"{srv.url}/signin?next={raw}", timeout=10).text) == want, raw


# --- a viewer token with a cluster reads only that cluster -------------------------------------


def _two_clusters(database_url: str, live_server):  # type: ignore[no-untyped-def]
    from tests.collector.conftest import make_batch
    from tests.collector.test_ingest import post

    e = make_engine(database_url)
    try:
        admin = create_token(e, "root", "admin")
        viewer = create_token(e, "viewer-a", "viewer", cluster="a")
    finally:
        e.dispose()
    srv = live_server(database_url, allow_anonymous=False)
    now = time.time() - 120
    for cl in ("a", "b"):
        b = make_batch(f"node-{cl}", cluster=cl, start=now, gpus=2, seconds=2, job="42", user=f"user-{cl}")
        assert post(srv.url, b, token=admin).status_code == 200
    return srv, {"Authorization": f"Bearer {admin}"}, {"Authorization": f"Bearer {viewer}"}


def test_a_cluster_viewer_reads_only_its_cluster(database_url: str, live_server) -> None:  # type: ignore[no-untyped-def]
    srv, admin, viewer = _two_clusters(database_url, live_server)
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        for path in ("/api/v1/jobs", "/api/v1/nodes"):
            everyone = c.get(path, headers=admin).text
            assert "node-b" in everyone or "user-b" in everyone, everyone
            mine = c.get(path, headers=viewer)
            assert mine.status_code == 200 and ("node-a" in mine.text or "user-a" in mine.text), mine.text
            assert "node-b" not in mine.text and "user-b" not in mine.text, mine.text
            assert mine.json() == c.get(path + "?cluster=a", headers=admin).json()
        for path in ("/api/v1/fleet/summary", "/api/v1/flags", "/api/v1/fleet/ledger", "/api/v1/deployments",
                     "/api/v1/jobs/42", "/api/v1/jobs/42/timeline", "/api/v1/jobs/42/progress",
                     "/api/v1/nodes/node-a", "/api/v1/catalog", "/api/v1/flag-kinds"):
            r = c.get(path, headers=viewer)
            assert r.status_code == 200 and "node-b" not in r.text and "user-b" not in r.text, (path, r.text[:300])
        assert c.get("/api/v1/jobs/42", headers=viewer).json()["user"] == "user-a"
        # another cluster, asked for by name: refused, not quietly answered
        for path in ("/api/v1/jobs?cluster=b", "/api/v1/jobs/42?cluster=b", "/api/v1/nodes/node-b?cluster=b",
                     "/api/v1/fleet/summary?cluster=a&cluster=b"):
            r = c.get(path, headers=viewer)
            assert r.status_code == 403 and "'a'" in r.json()["detail"], (path, r.text)
        assert c.get("/api/v1/nodes/node-b", headers=viewer).status_code == 404  # looked up in cluster a
        # reads that are not per cluster: refused (fail closed)
        from tests.collector.conftest import gpu_uuid

        for path in (f"/api/v1/gpus/{gpu_uuid('node-a', 0)}", "/api/v1/alerts", "/api/v1/alerts/silences",
                     "/web/search?q=node", "/api/v1/tokens"):
            r = c.get(path, headers=viewer)
            assert r.status_code == 403, (path, r.text)
        # the same through a browser session signed in with the token
        r = c.post("/api/v1/auth/signin", json={"token": viewer["Authorization"][7:]})
        assert r.status_code == 200, r.text
        mine = c.get("/api/v1/jobs")
        assert mine.status_code == 200 and "user-b" not in mine.text and "user-a" in mine.text
        assert c.get("/api/v1/jobs?cluster=b").status_code == 403
        assert c.get("/api/v1/alerts").status_code == 403


def test_every_read_a_cluster_viewer_reaches_is_filtered_by_cluster() -> None:
    """Fail closed: a route answers a cluster-scoped viewer only when it takes ``cluster``, which
    the web layer forces; any route added later is refused until listed in api/auth/cluster_scope."""
    from fastapi.routing import APIRoute

    from gpufleet.api.auth.cluster_scope import UNSCOPED, OutOfScope, scoped_query
    from gpufleet.server import create_app
    from tests.conftest import make_settings

    def walk(routes: list, prefix: str = "") -> Iterator[tuple[str, APIRoute]]:
        for r in routes:  # FastAPI keeps included routers as they are: look inside
            if hasattr(r, "original_router"):
                yield from walk(r.original_router.routes, prefix + (getattr(r.include_context, "prefix", "") or ""))
            elif isinstance(r, APIRoute):
                yield prefix + r.path, r

    app = create_app(make_settings("sqlite://"))
    reached = []
    for path, route in walk(app.routes):
        if not ({"GET"} & route.methods):
            continue
        sample = re.sub(r"\{[^}]+\}", "x", path)
        try:
            q = scoped_query("GET", sample, b"", "a")
        except OutOfScope:
            continue
        if sample in UNSCOPED or not sample.startswith(("/api/", "/web/")):
            continue
        reached.append(path)
        assert q == b"cluster=a"
        assert "cluster" in {p.name for p in route.dependant.query_params}, path
    assert "/api/v1/jobs" in reached and "/api/v1/nodes/{name}" in reached, reached


def test_operator_and_admin_tokens_refuse_a_cluster(database_url: str, live_server) -> None:  # type: ignore[no-untyped-def]
    e = make_engine(database_url)
    try:
        for role in ("operator", "admin"):
            with pytest.raises(ValueError, match="--cluster"):
                create_token(e, f"v-{role}", role, cluster="a")
        admin = create_token(e, "root", "admin")
        legacy = create_token(e, "legacy-op", "operator")
        with e.begin() as c:  # an operator token made with a cluster by an older version
            c.execute(sa.text("update api_tokens set cluster = 'a' where name = 'legacy-op'"))
    finally:
        e.dispose()
    srv = live_server(database_url, allow_anonymous=False)
    h = {"Authorization": f"Bearer {admin}"}
    r = httpx.post(f"{srv.url}/api/v1/tokens", json={"name": "o2", "role": "operator", "cluster": "a"}, headers=h)
    assert r.status_code == 422 and "--cluster" in r.json()["detail"], r.text
    out = subprocess.run([sys.executable, "-m", "gpufleet.cli", "token", "create", "o3", "--role", "admin",
                          "--cluster", "a", "--database-url", database_url], capture_output=True, text=True)
    assert out.returncode == 2 and "--cluster" in out.stdout + out.stderr, out
    r = httpx.post(f"{srv.url}/api/v1/tokens", json={"name": "v2", "role": "viewer", "cluster": "a"}, headers=h)
    assert r.status_code == 201, r.text
    # the legacy operator token reads nothing and cannot sign in
    for path in ("/api/v1/fleet/summary", "/api/v1/jobs", "/api/v1/alerts"):
        r = httpx.get(srv.url + path, headers={"Authorization": f"Bearer {legacy}"}, timeout=10)
        assert r.status_code == 403 and "cluster" in r.json()["detail"], (path, r.text)
    r = httpx.post(srv.url + "/api/v1/auth/signin", json={"token": legacy}, timeout=10)
    assert r.status_code == 401 and "cluster" in r.json()["detail"], r.text


# --- sign-in throttled per source ----------------------------------------------------------------


def test_wrong_sign_ins_are_throttled_per_source(database_url: str, live_server) -> None:  # type: ignore[no-untyped-def]
    e = make_engine(database_url)
    try:
        good = create_token(e, "good", "viewer")
    finally:
        e.dispose()
    srv = live_server(database_url, allow_anonymous=False, auth__signin_max_failures=5, auth__signin_window_s=600)
    with httpx.Client(base_url=srv.url, timeout=10) as c:
        codes = [c.post("/api/v1/auth/signin", json={"token": f"gpf_wrong{i}"}).status_code for i in range(30)]
        assert codes[:5] == [401] * 5 and set(codes[5:]) == {429}, codes
        r = c.post("/api/v1/auth/signin", json={"token": good})
        assert r.status_code == 429, "a right token does not reopen a throttled source (that would be an oracle)"
        assert 1 <= int(r.headers["Retry-After"]) <= 600 and "GPUFLEET_SIGNIN" in r.json()["detail"]
    # another source is not affected: its failures are its own (a trusted proxy names the client)
    srv2 = live_server(database_url, allow_anonymous=False, auth__signin_max_failures=2,
                       auth__trusted_proxies="127.0.0.1/32")
    with httpx.Client(base_url=srv2.url, timeout=10) as c:
        for ip in ("10.0.0.1", "10.0.0.1"):
            assert c.post("/api/v1/auth/signin", json={"token": "gpf_x"},
                          headers={"X-Forwarded-For": ip}).status_code == 401
        assert c.post("/api/v1/auth/signin", json={"token": "gpf_x"},
                      headers={"X-Forwarded-For": "10.0.0.1"}).status_code == 429
        r = c.post("/api/v1/auth/signin", json={"token": good}, headers={"X-Forwarded-For": "10.0.0.2"})
        assert r.status_code == 200, r.text
