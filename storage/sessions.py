"""Server-side browser sessions: created when someone signs in with a viewer/operator/admin token
(or arrives through a trusted SSO proxy), looked up by the SHA-256 of the cookie's random id,
ended by sign-out, by expiry, or by revoking the token they were made from.

The CSRF token of a session is derived from its id (HMAC), so it needs no storage and a page can
only know it by reading the session's own cookie-side value (``csrf_for``): a cross-site page
can neither read it nor guess it."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass

from sqlalchemy import Engine, delete, insert, select

from gpufleet.storage.models import ApiToken
from gpufleet.storage.session_models import WebSession
from gpufleet.storage.tokens import ROLES, TokenInfo, unsupported_scope, verify_token

W = WebSession.__table__
SESSION_PREFIX = "gps_"
_NAME_MAX = 255


@dataclass(frozen=True)
class Session:
    id: int
    name: str
    role: str
    cluster: str | None
    source: str
    expires_at: float

    def identity(self) -> TokenInfo:
        return TokenInfo(self.name, self.role, self.cluster, None)


def _hash(raw: str) -> str:
    return hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()


def csrf_for(raw_session: str) -> str:
    """The CSRF token that goes with a session id (sent back in the X-CSRF-Token header)."""
    return hmac.new(raw_session.encode("utf-8", "surrogatepass"), b"gpufleet csrf v1", hashlib.sha256).hexdigest()


def csrf_ok(raw_session: str, presented: str | None) -> bool:
    return bool(presented) and hmac.compare_digest(csrf_for(raw_session), presented or "")


class SignInError(ValueError):
    pass


def sign_in_with_token(engine: Engine, raw_token: str, ttl_s: float, now: float | None = None) -> tuple[str, Session]:
    """A new session for the holder of ``raw_token``; returns (raw session id, session).
    Agent tokens cannot sign in: they only write telemetry."""
    info = verify_token(engine, raw_token.strip())
    if info is None:
        raise SignInError("unknown or revoked token")
    if info.role == "agent":
        raise SignInError(f"token {info.name!r} is an agent token; sign in with a viewer, operator or admin token")
    why = unsupported_scope(info, info.cluster)  # a cluster viewer's session is narrowed like its token
    if why is not None:
        raise SignInError(why)
    with engine.connect() as c:
        token_id = c.execute(select(ApiToken.id).where(ApiToken.name == info.name)).scalar_one_or_none()
    return _create(engine, info.name, info.role, info.cluster, "token", token_id, ttl_s, now)


def sign_in_sso(engine: Engine, user: str, role: str, ttl_s: float, now: float | None = None) -> tuple[str, Session]:
    return _create(engine, user, role, None, "sso", None, ttl_s, now)


def _create(engine: Engine, name: str, role: str, cluster: str | None, source: str, token_id: int | None,
            ttl_s: float, now: float | None) -> tuple[str, Session]:
    if role not in ROLES or role == "agent":
        raise SignInError(f"role {role!r} cannot sign in")
    if not name or len(name) > _NAME_MAX or "\x00" in name:
        raise SignInError(f"a user name must be 1-{_NAME_MAX} characters without NUL")
    now = time.time() if now is None else now
    raw = SESSION_PREFIX + secrets.token_urlsafe(32)
    with engine.begin() as c:
        pk = c.execute(insert(W).values(session_hash=_hash(raw), name=name, role=role, cluster=cluster, source=source,
                                        token_id=token_id, created_at=now, expires_at=now + ttl_s)
                       ).inserted_primary_key
        if pk is None:  # a single-row INSERT always has one; SQLAlchemy types it Optional (executemany has none)
            raise RuntimeError("the session INSERT returned no primary key")
        sid = pk[0]
    return raw, Session(int(sid), name, role, cluster, source, now + ttl_s)


def lookup(engine: Engine, raw: str | None, now: float | None = None) -> Session | None:
    """The live session for a cookie value, or None (unknown, expired, signed out, or its token
    revoked)."""
    if not raw or not raw.startswith(SESSION_PREFIX) or len(raw) > 128:
        return None
    now = time.time() if now is None else now
    q = (select(W.c.id, W.c.name, W.c.role, W.c.cluster, W.c.source, W.c.expires_at, W.c.token_id,
                ApiToken.revoked_at)
         .outerjoin(ApiToken, ApiToken.id == W.c.token_id).where(W.c.session_hash == _hash(raw)))
    with engine.connect() as c:
        r = c.execute(q).first()
    if r is None or r.expires_at <= now:
        return None
    if r.source == "token" and (r.token_id is None or r.revoked_at is not None):
        return None
    return Session(r.id, r.name, r.role, r.cluster, r.source, r.expires_at)


def sign_out(engine: Engine, raw: str | None) -> bool:
    if not raw:
        return False
    with engine.begin() as c:
        return c.execute(delete(W).where(W.c.session_hash == _hash(raw))).rowcount == 1


def purge_expired(engine: Engine, now: float | None = None) -> int:
    now = time.time() if now is None else now
    with engine.begin() as c:
        return c.execute(delete(W).where(W.c.expires_at <= now)).rowcount
