"""FastAPI dependencies shared by every API router: the engine, settings and the caller's role.

Auth is delegated to ``gpufleet.storage.tokens`` (hashes, roles, revocation); this module only
adapts it to FastAPI so handlers declare what they need with one ``Annotated`` alias."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request
from sqlalchemy import Engine, select

from gpufleet.settings import ServerSettings

ROLES = ("agent", "viewer", "operator", "admin")


@dataclass(frozen=True, slots=True)
class Caller:
    name: str
    role: str


def get_engine(request: Request) -> Engine:
    return request.app.state.engine


def get_settings(request: Request) -> ServerSettings:
    return request.app.state.settings


EngineDep = Annotated[Engine, Depends(get_engine)]
SettingsDep = Annotated[ServerSettings, Depends(get_settings)]


def _authorize_fallback(engine: Engine, header: str | None, role: str, allow_anonymous: bool) -> Caller:
    # Used only until gpufleet.storage.tokens lands: same semantics (sha256 of the bearer
    # token, revoked tokens refused, role order agent < viewer < operator < admin).
    from gpufleet.storage.models import ApiToken

    if not header:
        if allow_anonymous:
            return Caller("anonymous", "admin")
        raise HTTPException(401, "missing bearer token; create one with `gpufleet token create`",
                            headers={"WWW-Authenticate": "Bearer"})
    scheme, _, raw = header.partition(" ")
    if scheme.lower() != "bearer" or not raw.strip():
        raise HTTPException(401, "Authorization must be 'Bearer <token>'", headers={"WWW-Authenticate": "Bearer"})
    digest = hashlib.sha256(raw.strip().encode()).hexdigest()
    with engine.connect() as c:
        tok = c.execute(select(ApiToken.name, ApiToken.role, ApiToken.revoked_at)
                        .where(ApiToken.token_hash == digest)).first()
    if tok is None or tok.revoked_at is not None:
        raise HTTPException(401, "unknown or revoked token", headers={"WWW-Authenticate": "Bearer"})
    if ROLES.index(tok.role) < ROLES.index(role):
        raise HTTPException(403, f"token {tok.name!r} has role {tok.role}; this needs {role}")
    return Caller(tok.name, tok.role)


def _authorize(request: Request, role: str) -> Caller:
    engine: Engine = request.app.state.engine
    allow = bool(getattr(request.app.state.settings, "allow_anonymous", False))
    header = request.headers.get("authorization")
    try:
        from gpufleet.storage import tokens
    except ImportError:
        return _authorize_fallback(engine, header, role, allow)
    try:
        info: Any = tokens.authorize(engine, header, role, allow)
    except tokens.AuthError as e:
        extra = {"WWW-Authenticate": "Bearer"} if e.status == 401 else None
        raise HTTPException(e.status, e.detail, headers=extra) from None
    return Caller(str(getattr(info, "name", "anonymous") or "anonymous"), str(getattr(info, "role", role)))


def require_viewer(request: Request) -> Caller:
    return _authorize(request, "viewer")


def require_operator(request: Request) -> Caller:
    return _authorize(request, "operator")


ViewerDep = Annotated[Caller, Depends(require_viewer)]
OperatorDep = Annotated[Caller, Depends(require_operator)]
