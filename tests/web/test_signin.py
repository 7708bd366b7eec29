"""Production sign-in in a real headless Chromium against the real app (anonymous access off):
redirect to the sign-in page, a bad token refused, sign in and see data, roles as the API has
them, CSRF and cross-site writes refused, sign out; and the trusted SSO proxy mode. Screenshots
go to artifacts/screenshots/ (git-ignored)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import pytest
import sqlalchemy as sa
from apiseed import seed
from webpage import Page

from gpufleet.storage.db import make_engine
from gpufleet.storage.tokens import create_token

pytestmark = pytest.mark.browser

SILENCE = {"job": "1002", "reason": "maintenance", "expires_in": "1h"}


def _at(path: str) -> Callable[[str], bool]:
    """A wait_for_url predicate for exactly ``path``: the glob "**/tokens" also matches
    "/signin?next=/tokens", so it returned while the sign-in page was still showing and the
    next wait read a missing element (a CI flake)."""
    return lambda url: urlsplit(url).path == path


def _silences(url: str) -> int:
    e = sa.create_engine(url)
    try:
        with e.connect() as c:
            return int(c.execute(sa.text("select count(*) from alert_silences")).scalar_one())
    finally:
        e.dispose()


@pytest.fixture
def prod(sqlite_url: str, live_server: Callable[..., Any]) -> tuple[Any, dict[str, str], str]:
    e = make_engine(sqlite_url)
    seed(e)
    toks = {r: create_token(e, f"web-{r}", r) for r in ("viewer", "operator", "admin")}
    e.dispose()
    return live_server(sqlite_url, allow_anonymous=False), toks, sqlite_url


def _post_js(pg: Any, with_csrf: bool) -> int:
    """A change from the page's own script, with or without the session's CSRF token."""
    fn = "window.gpufleetFetch" if with_csrf else "fetch"
    return int(pg.evaluate(f"""async (body) => (await {fn}('/api/v1/alerts/silences', {{method: 'POST',
        headers: {{'Content-Type': 'application/json'}}, body: JSON.stringify(body),
        credentials: 'same-origin'}})).status""", SILENCE))


def _sign_in(p: Page, token: str) -> Any:
    pg = p.page
    pg.fill("#token", token)
    pg.click("#signin-form button[type=submit]")
    return pg


def test_sign_in_see_data_csrf_refused_sign_out(browser: Any, prod: tuple[Any, dict[str, str], str]) -> None:
    srv, toks, url = prod
    ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    p = Page(ctx.new_page(), srv.url)
    pg = p.page
    try:
        pg.goto(srv.url + "/jobs")
        pg.wait_for_url("**/signin?next=%2Fjobs")
        assert pg.locator("h1").inner_text() == "Sign in"
        p.shot("signin-page")

        _sign_in(p, "gpf_not_a_token")
        pg.wait_for_function("() => document.getElementById('signin-error').textContent.length > 0")
        assert "unknown or revoked token" in pg.locator("#signin-error").inner_text()
        p.shot("signin-refused")

        _sign_in(p, toks["viewer"])
        pg.wait_for_url("**/jobs")
        pg.wait_for_function("() => window.__gpufleet && window.__gpufleet.ready === true")
        assert pg.locator("table.jobs tbody tr").count() == 5, "signed in: the data shows"
        assert pg.locator("#who").inner_text().startswith("web-viewer (viewer)")
        cookies = {c["name"]: c for c in ctx.cookies()}
        assert cookies["gpufleet_session"]["httpOnly"] and cookies["gpufleet_session"]["sameSite"] == "Strict"
        assert pg.evaluate("() => document.cookie").find("gpufleet_session") < 0, "script cannot read the session"
        p.shot("signed-in-viewer")

        # roles as in the API: a viewer's page may not silence, even with the CSRF token
        assert _post_js(pg, with_csrf=True) == 403
        assert pg.evaluate("() => window.gpufleetSession.can") == {"read": True, "silence": False, "tokens": False}

        pg.click("#signout")
        pg.wait_for_url("**/signin")
        pg.goto(srv.url + "/")
        pg.wait_for_url("**/signin?next=%2F")

        _sign_in(p, toks["operator"])
        pg.wait_for_url(srv.url + "/")
        pg.wait_for_function("() => window.__gpufleet && window.__gpufleet.ready === true")
        assert pg.locator("#gpu-grid .cell").count() == 8
        assert _post_js(pg, with_csrf=False) == 403, "the cookie alone does not make a change: CSRF refused"
        assert _silences(url) == 0
        assert _post_js(pg, with_csrf=True) == 201
        assert _silences(url) == 1
        p.shot("signed-in-operator")

        pg.click("#signout")
        pg.wait_for_url("**/signin")
        status = pg.evaluate("async () => (await fetch('/api/v1/fleet/summary')).status")
        assert status == 401, "signed out: the session is gone on the server, not just in the browser"
        p.shot("signed-out")
        assert not p.errors or all("401" in e or "403" in e for e in p.errors), p.errors
    finally:
        ctx.close()


def test_another_site_cannot_write_with_the_session(browser: Any, prod: tuple[Any, dict[str, str], str],
                                                    live_server: Callable[..., Any], tmp_path: Any) -> None:
    srv, toks, url = prod
    other = live_server(f"sqlite:///{tmp_path / 'other.db'}", allow_anonymous=True)  # another origin (port)
    from gpufleet.storage.migrate import upgrade

    upgrade(f"sqlite:///{tmp_path / 'other.db'}")
    ctx = browser.new_context()
    p = Page(ctx.new_page(), srv.url)
    try:
        p.page.goto(srv.url + "/signin")
        _sign_in(p, toks["operator"])
        p.page.wait_for_url(srv.url + "/")
        p.page.goto(other.url + "/signin")  # "evil" page, same browser, the victim still signed in
        p.page.evaluate("""async ([target, body]) => {
            try { await fetch(target + '/api/v1/alerts/silences', {method: 'POST', mode: 'no-cors',
                  credentials: 'include', headers: {'Content-Type': 'text/plain'}, body}); } catch (e) {}
        }""", [srv.url, json.dumps(SILENCE)])
        assert _silences(url) == 0, "a cross-site text/plain POST stored nothing"
    finally:
        ctx.close()


def test_sso_proxy_in_the_browser(browser: Any, sqlite_url: str, live_server: Callable[..., Any],
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLEET_TRUSTED_PROXIES", "127.0.0.1")
    monkeypatch.setenv("GPUFLEET_PROXY_GROUP_ROLES", "gpu-oncall=operator,*=viewer")
    e = make_engine(sqlite_url)
    seed(e)
    e.dispose()
    srv = live_server(sqlite_url, allow_anonymous=False)
    # the proxy (here: the browser's extra headers from 127.0.0.1) says who signed in at the SSO
    ctx = browser.new_context(extra_http_headers={"X-Forwarded-User": "alice", "X-Forwarded-Email":
                                                  "alice@corp.example", "X-Forwarded-Groups": "gpu-oncall"})
    p = Page(ctx.new_page(), srv.url)
    try:
        pg = p.open("/")
        pg.wait_for_function("() => document.getElementById('who') !== null")
        assert pg.locator("#who").inner_text().startswith("alice@corp.example (operator)")
        assert pg.locator("#gpu-grid .cell").count() == 8
        assert _post_js(pg, with_csrf=False) == 403
        assert _post_js(pg, with_csrf=True) == 201
        p.shot("sso-operator")
    finally:
        ctx.close()


def test_roles_in_the_ui_match_the_api(browser: Any, prod: tuple[Any, dict[str, str], str]) -> None:
    """Silences need operator in the UI as in the API: a viewer sees them but no form and no
    Expire buttons; an operator creates one with the form and expires it."""
    srv, toks, url = prod
    import httpx

    r = httpx.post(srv.url + "/api/v1/alerts/silences", json={**SILENCE, "reason": "seeded"},
                   headers={"Authorization": f"Bearer {toks['operator']}"})
    assert r.status_code == 201
    ctx = browser.new_context(viewport={"width": 1280, "height": 700})
    p = Page(ctx.new_page(), srv.url)
    pg = p.page
    try:
        pg.goto(srv.url + "/silences")
        pg.wait_for_url("**/signin?next=%2Fsilences")
        _sign_in(p, toks["viewer"])
        pg.wait_for_url("**/silences")
        pg.wait_for_function("() => document.getElementById('silences').dataset.loaded === '1'")
        assert pg.locator("table.silences tbody tr").count() == 1
        assert pg.locator("#silence-form").count() == 0, "no silence form for a viewer"
        assert pg.locator("button.expire").count() == 0
        p.shot("silences-viewer")
        pg.click("#signout")
        pg.wait_for_url("**/signin")

        pg.goto(srv.url + "/signin?next=/silences")
        _sign_in(p, toks["operator"])
        pg.wait_for_url(_at("/silences"))
        pg.wait_for_function("() => document.getElementById('silences').dataset.loaded === '1'")
        pg.fill("#silence-form input[name=user]", "bob")
        pg.fill("#silence-form input[name=reason]", "reservation for the notebook")
        pg.click("#silence-form button[type=submit]")
        pg.wait_for_function("() => document.getElementById('silences').dataset.loaded === '2'")
        assert _silences(url) == 2
        assert "reservation for the notebook" in pg.locator("table.silences").inner_text()
        p.shot("silences-operator")
        pg.locator("tr", has_text="reservation for the notebook").locator("button.expire").click()
        pg.wait_for_function("() => document.getElementById('silences').dataset.loaded === '1'")
        assert pg.locator("#silence-error").inner_text() == ""
    finally:
        ctx.close()


def test_tokens_page_is_for_admins(browser: Any, prod: tuple[Any, dict[str, str], str]) -> None:
    """Tokens need admin in the UI as in the API: an operator gets the page without its controls
    (and the API refuses the same calls); an admin creates a token, sees it once, revokes it."""
    srv, toks, url = prod
    import httpx

    r = httpx.get(srv.url + "/api/v1/tokens", headers={"Authorization": f"Bearer {toks['operator']}"})
    assert r.status_code == 403
    ctx = browser.new_context(viewport={"width": 1280, "height": 700})
    p = Page(ctx.new_page(), srv.url)
    pg = p.page
    try:
        pg.goto(srv.url + "/signin?next=/tokens")
        _sign_in(p, toks["operator"])
        pg.wait_for_url(_at("/tokens"))
        pg.wait_for_selector("#tokens-denied:not([hidden])")
        assert pg.locator("#token-form").count() == 0
        pg.click("#signout")
        pg.wait_for_url("**/signin")
        pg.goto(srv.url + "/signin?next=/tokens")
        _sign_in(p, toks["admin"])
        pg.wait_for_url(_at("/tokens"))
        pg.wait_for_function("() => document.getElementById('tokens').dataset.loaded === '3'")
        pg.fill("#token-form input[name=name]", "grafana-reader")
        pg.click("#token-form button[type=submit]")
        pg.wait_for_function("() => document.getElementById('tokens').dataset.loaded === '4'")
        shown = pg.locator("#token-new").inner_text()
        raw = shown.rsplit(" ", 1)[1]
        assert raw.startswith("gpf_")
        r = httpx.get(srv.url + "/api/v1/fleet/summary", headers={"Authorization": f"Bearer {raw}"})
        assert r.status_code == 200, "the token the page showed works"
        p.shot("tokens-admin")
        pg.locator("tr", has_text="grafana-reader").locator("button.revoke").click()
        pg.wait_for_function("() => document.querySelectorAll('button.revoke').length === 3")  # 3 seeded stay live
        e = sa.create_engine(url)
        with e.connect() as c:
            revoked = c.execute(sa.text("select revoked_at from api_tokens where name = 'grafana-reader'")).scalar_one()
        e.dispose()
        assert revoked is not None
    finally:
        ctx.close()


@pytest.mark.parametrize(("page", "role", "loaded"), [("silences", "viewer", "1"), ("tokens", "admin", "3")])
def test_a_page_script_that_arrives_after_the_session_still_loads_the_page(
        browser: Any, prod: tuple[Any, dict[str, str], str], page: str, role: str, loaded: str) -> None:
    """The page's script held back until /api/v1/auth/me has answered (what a slow static fetch
    or a busy box does): the session's one event has fired before the script listens, and the
    page must load all the same (a CI run caught the silences page empty this way)."""
    import time

    import httpx

    srv, toks, _ = prod
    r = httpx.post(srv.url + "/api/v1/alerts/silences", json={**SILENCE, "reason": "seeded"},
                   headers={"Authorization": f"Bearer {toks['operator']}"})
    assert r.status_code == 201
    ctx = browser.new_context(viewport={"width": 1280, "height": 700})
    p = Page(ctx.new_page(), srv.url)
    pg = p.page

    def late(route: Any) -> None:
        time.sleep(1.5)
        route.continue_()

    try:
        pg.goto(srv.url + f"/signin?next=/{page}")
        _sign_in(p, toks[role])
        pg.wait_for_url(_at(f"/{page}"))
        ctx.route(f"**/static/auth/{page}.js", late)
        pg.reload()
        pg.wait_for_function(f"() => document.getElementById('{page}').dataset.loaded === '{loaded}'", timeout=20_000)
        # the browser's own timings: the session answered before the page's script arrived
        me, script = pg.evaluate(f"""() => {{
            const end = (s) => performance.getEntriesByType('resource').filter((e) => e.name.includes(s))
                .map((e) => e.responseEnd).pop();
            return [end('/api/v1/auth/me'), end('/static/auth/{page}.js')]; }}""")
        assert me is not None and script is not None and me < script, "the race was not staged"
    finally:
        ctx.close()
