"""Issue 38 items 9 and 11 (sign-in side), over real HTTP against the real app on SQLite and
PostgreSQL: ``next=`` after sign-in only to same-origin paths; a viewer token cannot be scoped to a
cluster it would then read past (``--cluster`` is refused for people's tokens, and such a token
made before is refused rather than read everything); wrong sign-ins are throttled per source."""

from __future__ import annotations

import html
import re
import subprocess
import sys

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


# --- a viewer token with a cluster --------------------------------------------------------------


def test_people_tokens_refuse_a_cluster(database_url: str, live_server) -> None:  # type: ignore[no-untyped-def]
    e = make_engine(database_url)
    try:
        for role in ("viewer", "operator", "admin"):
            with pytest.raises(ValueError, match="--cluster"):
                create_token(e, f"v-{role}", role, cluster="a")
        admin = create_token(e, "root", "admin")
        create_token(e, "agent-a", "agent", cluster="a")  # agents stay cluster-scoped
    finally:
        e.dispose()
    srv = live_server(database_url, allow_anonymous=False)
    h = {"Authorization": f"Bearer {admin}"}
    r = httpx.post(f"{srv.url}/api/v1/tokens", json={"name": "v2", "role": "viewer", "cluster": "a"}, headers=h)
    assert r.status_code == 422 and "--cluster" in r.json()["detail"], r.text
    # the CLI says the same, exit 2
    out = subprocess.run([sys.executable, "-m", "gpufleet.cli", "token", "create", "v3", "--role", "viewer",
                          "--cluster", "a", "--database-url", database_url], capture_output=True, text=True)
    assert out.returncode == 2 and "--cluster" in out.stdout + out.stderr, out


def test_a_cluster_viewer_token_made_before_reads_nothing(database_url: str, live_server) -> None:  # type: ignore[no-untyped-def]
    """A viewer token stored with a cluster (made before --cluster was refused) would read every
    cluster: it is refused (403 saying why), on the API and at sign-in, not honoured as unscoped."""
    e = make_engine(database_url)
    try:
        create_token(e, "legacy", "viewer")
        raw = create_token(e, "legacy2", "viewer")
        with e.begin() as c:
            c.execute(sa.text("update api_tokens set cluster = 'a' where name = 'legacy2'"))
    finally:
        e.dispose()
    srv = live_server(database_url, allow_anonymous=False)
    for path in ("/api/v1/fleet/summary", "/api/v1/jobs", "/api/v1/nodes"):
        r = httpx.get(srv.url + path, headers={"Authorization": f"Bearer {raw}"}, timeout=10)
        assert r.status_code == 403 and "cluster" in r.json()["detail"], (path, r.text)
    r = httpx.post(srv.url + "/api/v1/auth/signin", json={"token": raw}, timeout=10)
    assert r.status_code == 401 and "cluster" in r.json()["detail"], r.text
    # a session opened with it before the upgrade reads nothing either
    from gpufleet.storage import sessions

    e = make_engine(database_url)
    try:
        with e.connect() as c:
            tid = c.execute(sa.text("select id from api_tokens where name = 'legacy2'")).scalar_one()
        sid, _ = sessions._create(e, "legacy2", "viewer", "a", "token", tid, 3600.0, None)
    finally:
        e.dispose()
    with httpx.Client(base_url=srv.url, timeout=10, cookies={"gpufleet_session": sid}) as c:
        r = c.get("/api/v1/jobs")
        assert r.status_code == 403 and "cluster" in r.json()["detail"], r.text


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
