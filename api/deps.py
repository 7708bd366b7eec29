"""FastAPI dependencies shared by every API router: the engine, settings and the caller.

Auth lives in ``gpufleet.storage.tokens`` (hashes, roles, revocation, anonymous mode); this
module only adapts it to FastAPI so handlers declare what they need with one alias."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import Engine

from gpufleet.settings import Settings
from gpufleet.storage import tokens
from gpufleet.storage.tokens import TokenInfo


def get_engine(request: Request) -> Engine:
    return request.app.state.engine


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


EngineDep = Annotated[Engine, Depends(get_engine)]
SettingsDep = Annotated[Settings, Depends(get_settings)]


def _authorize(request: Request, role: str) -> TokenInfo:
    settings = request.app.state.settings
    try:
        return tokens.authorize(request.app.state.engine, request.headers.get("authorization"), role,
                                settings.auth.allow_anonymous, request.scope.get("gpufleet.identity"),
                                request.scope.get("gpufleet.cluster_scope"))
    except tokens.AuthError as e:
        extra = {"WWW-Authenticate": "Bearer"} if e.status == 401 else None
        raise HTTPException(e.status, e.detail, headers=extra) from None


# Declares the bearer scheme in OpenAPI (the /docs "Authorize" button); the check itself is
# tokens.authorize, which also knows about anonymous mode, so auto_error is off.
bearer = HTTPBearer(auto_error=False, description="API token from `gpufleet token create --role viewer`")
Bearer = Annotated[HTTPAuthorizationCredentials | None, Security(bearer)]


def require_viewer(request: Request, _: Bearer) -> TokenInfo:
    """Read access: viewer, operator or admin (agent tokens only write telemetry)."""
    return _authorize(request, "viewer")


def require_operator(request: Request, _: Bearer) -> TokenInfo:
    return _authorize(request, "operator")


def require_admin(request: Request, _: Bearer) -> TokenInfo:
    return _authorize(request, "admin")


ViewerDep = Annotated[TokenInfo, Depends(require_viewer)]
OperatorDep = Annotated[TokenInfo, Depends(require_operator)]
AdminDep = Annotated[TokenInfo, Depends(require_admin)]
