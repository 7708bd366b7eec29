"""Sign-in page and ``/api/v1/auth/*``: sign in with a token, sign out, who am I.

A session is a row in ``web_sessions`` (``storage.sessions``); the browser holds its random id
in an HttpOnly, SameSite=Strict cookie (Secure over HTTPS) and the derived CSRF token in a
script-readable cookie the pages echo in ``X-CSRF-Token``. ``WebGuard`` turns the cookie into
the caller's identity on every request."""

from __future__ import annotations

import html
import time
from pathlib import Path
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from gpufleet.storage import sessions
from gpufleet.storage.tokens import role_at_least

from .gpus import router as gpus_router
from .identity import CSRF_COOKIE, SESSION_COOKIE
from .middleware import IDENTITY, SESSION, SSO, web_auth_config
from .redirects import safe_next
from .throttle import SignInThrottle, client_source
from .tokens import router as tokens_router

router = APIRouter(tags=["auth"])
router.include_router(tokens_router)  # /api/v1/tokens (admin)
router.include_router(gpus_router)  # /api/v1/gpus/{uuid}/move (admin)
STATIC = Path(__file__).resolve().parents[1] / "static" / "auth"
FILES = {"signin.js": "text/javascript", "session.js": "text/javascript", "silences.js": "text/javascript",
         "tokens.js": "text/javascript"}
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "frame-ancestors 'none'; base-uri 'none'; form-action 'self'")


class SignIn(BaseModel):
    token: str = Field(..., min_length=1, max_length=512, description="a viewer, operator or admin token")


def _secure(request: Request) -> bool:
    mode = web_auth_config(request.app.state.settings).cookie_secure
    if mode in ("true", "false"):
        return mode == "true"
    if request.url.scheme == "https":
        return True
    # Behind a TLS-terminating proxy only a trusted one may say the browser used HTTPS.
    from .identity import from_trusted_proxy

    cfg = web_auth_config(request.app.state.settings)
    client = request.client.host if request.client else None
    return from_trusted_proxy(client, cfg) and request.headers.get("x-forwarded-proto", "").lower() == "https"


def _set_cookies(request: Request, resp: Response, raw: str, ttl_s: float) -> None:
    secure = _secure(request)
    resp.set_cookie(SESSION_COOKIE, raw, max_age=int(ttl_s), path="/", httponly=True, secure=secure,
                    samesite="strict")
    resp.set_cookie(CSRF_COOKIE, sessions.csrf_for(raw), max_age=int(ttl_s), path="/", httponly=False,
                    secure=secure, samesite="strict")


def _clear_cookies(request: Request, resp: Response) -> None:
    secure = _secure(request)
    for name, http_only in ((SESSION_COOKIE, True), (CSRF_COOKIE, False)):
        resp.delete_cookie(name, path="/", httponly=http_only, secure=secure, samesite="strict")


def _caps(role: str) -> dict[str, bool]:
    """What the UI may offer: the same rule the API enforces (``tokens.role_at_least``)."""
    return {"read": role_at_least(role, "viewer"), "silence": role_at_least(role, "operator"),
            "tokens": role_at_least(role, "admin")}


def _throttle(request: Request) -> SignInThrottle:
    """This app's sign-in throttle (one per process), made from its settings on first use."""
    t: SignInThrottle | None = getattr(request.app.state, "signin_throttle", None)
    if t is None:
        auth = request.app.state.settings.auth
        t = request.app.state.signin_throttle = SignInThrottle(int(getattr(auth, "signin_max_failures", 10)),
                                                               float(getattr(auth, "signin_window_s", 60.0)))
    return t


@router.post("/api/v1/auth/signin")
async def sign_in(request: Request, body: SignIn) -> JSONResponse:
    """Exchange a token for a session cookie. The token itself is never stored in the browser."""
    cfg = web_auth_config(request.app.state.settings)
    throttle = _throttle(request)
    source = client_source(request.client.host if request.client else None,
                           request.headers.get("x-forwarded-for"), cfg)
    wait = throttle.retry_after(source, time.monotonic())
    if wait is not None:
        raise HTTPException(429, f"too many wrong sign-ins from {source}: try again in {wait} s "
                                 "(GPUFLEET_SIGNIN_MAX_FAILURES per GPUFLEET_SIGNIN_WINDOW_S)",
                            headers={"Retry-After": str(wait)})
    try:
        raw, s = await run_in_threadpool(sessions.sign_in_with_token, request.app.state.engine, body.token,
                                         cfg.session_ttl_s)
    except sessions.SignInError as e:
        throttle.failed(source, time.monotonic())
        raise HTTPException(401, str(e)) from None
    throttle.succeeded(source)
    resp = JSONResponse({"name": s.name, "role": s.role, "expires_at": s.expires_at, "can": _caps(s.role)})
    _set_cookies(request, resp, raw, cfg.session_ttl_s)
    resp.headers["Cache-Control"] = "no-store"
    return resp


@router.post("/api/v1/auth/signout")
async def sign_out(request: Request) -> JSONResponse:
    held = request.scope.get(SESSION)
    if held is not None:
        await run_in_threadpool(sessions.sign_out, request.app.state.engine, held[0])
    resp = JSONResponse({"signed_out": held is not None})
    _clear_cookies(request, resp)
    return resp


@router.get("/api/v1/auth/me")
async def me(request: Request) -> JSONResponse:
    """Who the browser is. Behind a trusted SSO proxy this also opens the session whose CSRF
    token the pages need for changes."""
    ident = request.scope.get(IDENTITY)
    settings = request.app.state.settings
    anonymous = bool(settings.auth.allow_anonymous)
    if ident is None:
        if request.headers.get("authorization"):
            raise HTTPException(400, "this endpoint describes browser sign-ins; bearer callers know their token")
        if anonymous:
            return JSONResponse({"name": "anonymous", "role": "admin", "source": "anonymous", "can": _caps("admin")},
                                headers={"Cache-Control": "no-store"})
        raise HTTPException(401, "not signed in", headers={"Location": "/signin"})
    source = "sso" if request.scope.get(SSO) else "token"
    resp = JSONResponse({"name": ident.name, "role": ident.role, "source": source, "can": _caps(ident.role)},
                        headers={"Cache-Control": "no-store"})
    if source == "sso" and request.scope.get(SESSION) is None:
        cfg = web_auth_config(settings)
        raw, _ = await run_in_threadpool(sessions.sign_in_sso, request.app.state.engine, ident.name, ident.role,
                                         cfg.session_ttl_s)
        _set_cookies(request, resp, raw, cfg.session_ttl_s)
    return resp


@router.get("/signin", response_class=HTMLResponse, include_in_schema=False)
def signin_page(request: Request, next: str = "/") -> HTMLResponse:
    # Only same-origin paths: an open redirect would let a link sign someone in, then send them away.
    target = safe_next(next)
    body = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Sign in · gpufleet</title>
<link rel="icon" href="/favicon.ico" type="image/svg+xml">
<link rel="stylesheet" href="/static/app.css">
</head><body>
<header><a class="brand" href="/">gpufleet</a></header>
<main id="signin" data-next="{html.escape(target, quote=True)}">
<h1>Sign in</h1>
<p class="muted">Paste a viewer, operator or admin token (<code>gpufleet token create NAME --role viewer</code>).
It is exchanged for a session cookie and not kept in the browser.</p>
<form id="signin-form" autocomplete="off">
<label for="token">Token</label>
<input id="token" name="token" type="password" required maxlength="512" autofocus>
<button type="submit">Sign in</button>
</form>
<p id="signin-error" class="error" role="alert"></p>
</main>
<script src="/static/auth/signin.js"></script>
</body></html>"""
    return HTMLResponse(body, headers={"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
                                       "Cache-Control": "no-store", "Referrer-Policy": "same-origin"})


@router.get("/silences", response_class=HTMLResponse, include_in_schema=False)
def silences_page(request: Request) -> HTMLResponse:
    """Alert silences: everyone who may read sees them; the form and the Expire buttons are
    marked ``data-needs="silence"`` and removed for roles below operator (session.js), the rule
    the API applies to the same requests."""
    body = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Silences · gpufleet</title>
<link rel="icon" href="/favicon.ico" type="image/svg+xml">
<link rel="stylesheet" href="/static/app.css">
</head><body>
<header><a class="brand" href="/">gpufleet</a><nav><a href="/">Fleet</a><a href="/jobs">Jobs</a>
<a href="/flags">Flags</a><a href="/silences" class="on">Silences</a></nav></header>
<main id="silences">
<h1>Alert silences</h1>
<p class="muted">A silence mutes Slack alerts for the jobs, users, flags or clusters it matches until it expires.</p>
<form id="silence-form" class="filters" data-needs="silence" autocomplete="off">
<label>job <input name="job" maxlength="255"></label>
<label>user <input name="user" maxlength="255"></label>
<label>flag <input name="flag" maxlength="32"></label>
<label>cluster <input name="cluster" maxlength="128"></label>
<label>expires in <input name="expires_in" value="24h" maxlength="16"></label>
<label>reason <input name="reason" required maxlength="2000"></label>
<button type="submit">Silence</button>
</form>
<p id="silence-error" class="error" role="alert"></p>
<table class="silences"><thead><tr><th>id</th><th>job</th><th>user</th><th>flag</th><th>cluster</th><th>reason</th>
<th>by</th><th>expires</th><th></th></tr></thead><tbody></tbody></table>
</main>
<script src="/static/auth/session.js"></script>
<script src="/static/auth/silences.js"></script>
</body></html>"""
    return HTMLResponse(body, headers={"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
                                       "Cache-Control": "no-cache"})


@router.get("/tokens", response_class=HTMLResponse, include_in_schema=False)
def tokens_page(request: Request) -> HTMLResponse:
    """API tokens, for admins only: the whole page body is ``data-needs="tokens"``."""
    body = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Tokens · gpufleet</title>
<link rel="icon" href="/favicon.ico" type="image/svg+xml">
<link rel="stylesheet" href="/static/app.css">
</head><body>
<header><a class="brand" href="/">gpufleet</a><nav><a href="/">Fleet</a><a href="/jobs">Jobs</a>
<a href="/flags">Flags</a><a href="/silences">Silences</a><a href="/tokens" class="on">Tokens</a></nav></header>
<main id="tokens">
<h1>API tokens</h1>
<p id="tokens-denied" class="muted" hidden>Managing tokens needs the admin role.</p>
<section data-needs="tokens">
<form id="token-form" class="filters" autocomplete="off">
<label>name <input name="name" required maxlength="128"></label>
<label>role <select name="role"><option>viewer</option><option>operator</option><option>admin</option>
<option>agent</option></select></label>
<label>cluster <input name="cluster" maxlength="128"></label>
<label>node <input name="node" maxlength="255"></label>
<button type="submit">Create</button>
</form>
<p id="token-new" class="muted"></p>
<p id="token-error" class="error" role="alert"></p>
<table class="tokens"><thead><tr><th>name</th><th>role</th><th>cluster</th><th>node</th><th>created</th>
<th>revoked</th><th></th></tr></thead><tbody></tbody></table>
</section>
</main>
<script src="/static/auth/session.js"></script>
<script src="/static/auth/tokens.js"></script>
</body></html>"""
    return HTMLResponse(body, headers={"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
                                       "Cache-Control": "no-store"})


@router.get("/static/auth/{name}", include_in_schema=False)
def auth_static(name: str) -> Any:
    if name not in FILES:
        raise HTTPException(404, "not found")
    return FileResponse(STATIC / name, media_type=FILES[name], headers={"Cache-Control": "no-cache"})
