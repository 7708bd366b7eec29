"""REST API for alerts: list alerts, manage silences (operator), inspect the outbox.

Auth goes through ``gpufleet.storage.tokens.authorize`` (viewer reads, operator writes)."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Depends, Header, HTTPException, Query, Request
from pydantic import BaseModel, Field

from gpufleet.alerts import silences as sil
from gpufleet.alerts.config import ConfigError, parse_duration

router = APIRouter(prefix="/api/v1/alerts", tags=["alerts"])


def require(role: str) -> Any:
    """A FastAPI dependency: the caller's token must carry at least ``role``."""

    def dep(request: Request, authorization: str | None = Header(default=None)) -> Any:
        from gpufleet.storage.tokens import AuthError, authorize

        settings = request.app.state.settings
        try:
            return authorize(request.app.state.engine, authorization, role, settings.auth.allow_anonymous,
                             request.scope.get("gpufleet.identity"))  # signed-in session or SSO (api.auth)
        except AuthError as e:
            status = getattr(e, "status", 401)
            raise HTTPException(status, getattr(e, "detail", str(e)),
                                headers={"WWW-Authenticate": "Bearer"} if status == 401 else None) from e

    return dep


def _who(token: Any) -> str:
    return str(getattr(token, "name", None) or "anonymous")


class SilenceIn(BaseModel):
    job: str | None = Field(None, max_length=255, description="scheduler job id")
    user: str | None = Field(None, max_length=255)
    flag: str | None = Field(None, max_length=32, description="flag kind, e.g. idle_gpu")
    cluster: str | None = Field(None, max_length=128)
    expires_in: str | float = Field("24h", description="duration: seconds or 30m / 4h / 7d")
    reason: str = Field(..., min_length=1, max_length=2000)


@router.get("")
def get_alerts(request: Request, state: str | None = Query(None, pattern="^(pending|firing|resolved)$"),
               _: Any = Depends(require("viewer"))) -> list[dict[str, Any]]:
    return sil.list_alerts(request.app.state.engine, state)


@router.get("/silences")
def get_silences(request: Request, include_expired: bool = False,
                 _: Any = Depends(require("viewer"))) -> list[dict[str, Any]]:
    return sil.list_silences(request.app.state.engine, time.time(), include_expired)


@router.post("/silences", status_code=201)
def post_silence(request: Request, body: SilenceIn, token: Any = Depends(require("operator"))) -> dict[str, Any]:
    try:
        dur = parse_duration(body.expires_in, "expires_in")
        new = sil.NewSilence(reason=body.reason, duration_s=dur, job=body.job or None, user=body.user or None,
                             kind=body.flag or None, cluster=body.cluster or None)
        return sil.create_silence(request.app.state.engine, new, _who(token), time.time())
    except (ConfigError, sil.SilenceError) as e:
        raise HTTPException(422, str(e)) from e


@router.delete("/silences/{silence_id}")
def delete_silence(request: Request, silence_id: int, _: Any = Depends(require("operator"))) -> dict[str, Any]:
    if not sil.expire_silence(request.app.state.engine, silence_id, time.time()):
        raise HTTPException(404, f"no active silence {silence_id}")
    return {"id": silence_id, "expired": True}


@router.get("/outbox")
def get_outbox(request: Request, state: str | None = Query(None, pattern="^(pending|sending|sent|failed)$"),
               _: Any = Depends(require("operator"))) -> list[dict[str, Any]]:
    return sil.list_outbox(request.app.state.engine, state)
