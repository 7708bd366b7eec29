"""``WebGuard``: the ASGI layer in front of every route (and of the ingest front).

For every HTTP request, in this order:

1. Cross-site state-changing requests (``hosts.cross_site``) get 403, in every mode.
2. Requests without a bearer token (browsers: anonymous, cookie or SSO) must name an allowed
   Host (``hosts.host_allowed``), else 421: DNS rebinding reaches nothing.
3. Identity: trusted SSO proxy headers, else the session cookie, go into
   ``scope["gpufleet.identity"]`` (a ``TokenInfo``) for ``storage.tokens.authorize``.
4. CSRF: a state-changing request authenticated by cookie or SSO must echo the session's CSRF
   token in ``X-CSRF-Token`` (sign-in itself excepted: there is no session yet), else 403.

Bearer-token requests (agents, scripts) skip 2-4: a browser never attaches a bearer token on
its own, so they carry no ambient authority for another site to borrow."""

from __future__ import annotations

import json
import logging
from typing import Any

from anyio import to_thread
from sqlalchemy.exc import DBAPIError

from gpufleet.api.database_unavailable import RETRY_AFTER_S
from gpufleet.storage import sessions
from gpufleet.storage.errors import is_transient, is_unreachable
from gpufleet.storage.tokens import TokenInfo, verify_token

from .cluster_scope import OutOfScope, scoped_query
from .config import WebAuthConfig
from .hosts import UNSAFE_METHODS, cross_site, host_allowed, split_host
from .identity import CSRF_HEADER, SESSION_COOKIE, SsoRefused, cookies, sso_identity

log = logging.getLogger(__name__)

CSRF_EXEMPT = frozenset({"/api/v1/auth/signin"})
IDENTITY = "gpufleet.identity"
SESSION = "gpufleet.session"  # the live storage.sessions.Session behind a cookie, if any
SSO = "gpufleet.sso"


async def _deny(send: Any, status: int, detail: str, retry_after_s: int | None = None) -> None:
    body = json.dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"cache-control", b"no-store")]
    if retry_after_s is not None:
        headers.append((b"retry-after", str(retry_after_s).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class WebGuard:
    """``app``: the next ASGI app; ``state_app``: the FastAPI app whose ``state`` holds the
    engine and settings (the same object when mounted inside it)."""

    def __init__(self, app: Any, state_app: Any = None, config: WebAuthConfig | None = None) -> None:
        self.app = app
        self.state_app = state_app if state_app is not None else app
        self._config = config

    def __getattr__(self, name: str) -> Any:  # state, router, ... of the wrapped app
        return getattr(self.app, name)

    @property
    def config(self) -> WebAuthConfig:
        if self._config is None:
            self._config = web_auth_config(self.state_app.state.settings)
        return self._config

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("gpufleet.guarded"):
            await self.app(scope, receive, send)
            return
        scope["gpufleet.guarded"] = True
        cfg = self.config
        method = scope["method"]
        h: dict[str, str] = {}
        for k, v in scope["headers"]:
            h.setdefault(k.decode("latin-1"), v.decode("latin-1"))
        host = h.get("host")
        why = cross_site(method, host, h.get("origin"), h.get("sec-fetch-site"))
        if why and not self._origin_configured(h.get("origin"), cfg):
            await _deny(send, 403, f"cross-site request refused: {why}")
            return
        if h.get("authorization"):
            # Reads only: writes (the intake hot paths among them) are never a viewer's, and
            # tokens.authorize refuses a scoped viewer wherever this did not narrow the request.
            if method in ("GET", "HEAD"):
                try:
                    info = await to_thread.run_sync(_bearer, self.state_app.state.engine, h["authorization"])
                except DBAPIError as e:
                    # The token lookup needs the database: down or failing over is transient
                    # (503 + Retry-After, as every handler answers it), not a 500 with a traceback.
                    if not (is_transient(e) or is_unreachable(e)):
                        raise
                    await _deny(send, 503, "database unavailable, retry later", RETRY_AFTER_S)
                    return
                if info is not None and not await _scope_reads(scope, send, info):
                    return
            await self.app(scope, receive, send)
            return
        if not host_allowed(host, cfg.allowed_hosts, cfg.implied_hosts):
            name = split_host(host or "")[0]
            await _deny(send, 421, f"this server does not answer to Host {name!r}: add it to GPUFLEET_ALLOWED_HOSTS "
                                   "(comma list; protects against DNS rebinding)")
            return
        client = scope.get("client")
        try:
            sso = sso_identity(client[0] if client else None, h, cfg)
        except SsoRefused as e:
            await _deny(send, 403, e.detail)
            return
        raw = cookies(h.get("cookie")).get(SESSION_COOKIE)
        session = None
        if raw:
            session = await to_thread.run_sync(sessions.lookup, self.state_app.state.engine, raw)
        if sso is not None:
            scope[IDENTITY] = sso
            scope[SSO] = True
            if session is not None and session.name != sso.name:
                session = None  # a session of someone the proxy no longer says is calling
        elif session is not None:
            scope[IDENTITY] = session.identity()
        if session is not None:
            scope[SESSION] = (raw, session)
        if IDENTITY in scope and not await _scope_reads(scope, send, scope[IDENTITY]):
            return
        if (method in UNSAFE_METHODS and IDENTITY in scope and scope["path"] not in CSRF_EXEMPT
                and (session is None or not sessions.csrf_ok(raw or "", h.get(CSRF_HEADER)))):
                await _deny(send, 403, "CSRF check failed: this change must come from a gpufleet page (reload it) "
                                       "or use a bearer token")
                return
        await self.app(scope, receive, send)

    @staticmethod
    def _origin_configured(origin: str | None, cfg: WebAuthConfig) -> bool:
        """An Origin explicitly listed in GPUFLEET_ALLOWED_HOSTS (a proxy that rewrites Host)."""
        if not origin or not cfg.allowed_hosts or "*" in cfg.allowed_hosts:
            return False
        from urllib.parse import urlsplit

        name = (urlsplit(origin.strip().lower()).hostname or "")
        return bool(name) and name in cfg.allowed_hosts


CLUSTER_SCOPE = "gpufleet.cluster_scope"  # the cluster a scoped viewer's request was narrowed to


def _bearer(engine: Any, header: str) -> TokenInfo | None:
    scheme, _, raw = header.partition(" ")
    return verify_token(engine, raw.strip()) if scheme.lower() == "bearer" else None


async def _scope_reads(scope: dict[str, Any], send: Any, who: TokenInfo) -> bool:
    """For a cluster-scoped viewer: narrow the request to its cluster (``cluster_scope``), or
    answer 403 and return False. Anyone else passes unchanged."""
    if who.cluster is None or who.role != "viewer":
        return True
    try:
        scope["query_string"] = scoped_query(scope["method"], scope["path"], scope.get("query_string", b""),
                                             who.cluster)
    except OutOfScope as e:
        await _deny(send, 403, e.detail)
        return False
    scope[CLUSTER_SCOPE] = who.cluster
    return True


def web_auth_config(settings: Any) -> WebAuthConfig:
    """Parsed once per Settings object (the app's settings never change while it runs)."""
    cached = _configs.get(id(settings))
    if cached is None or cached[0] is not settings:
        cached = (settings, WebAuthConfig.from_settings(settings))
        if len(_configs) > 64:
            _configs.clear()
        _configs[id(settings)] = cached
    return cached[1]


_configs: dict[int, tuple[Any, WebAuthConfig]] = {}
