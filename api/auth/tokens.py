"""``/api/v1/tokens``: list, create and revoke API tokens (admin only), the same operations as
``gpufleet token create|list|revoke`` and the same rules (``storage.tokens``). A new token's raw
value is in the creation answer only; the server keeps its hash."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException
from fastapi import Path as PathParam
from pydantic import BaseModel, Field
from sqlalchemy import Engine
from starlette.concurrency import run_in_threadpool

from gpufleet.api.deps import AdminDep, EngineDep
from gpufleet.storage import tokens

router = APIRouter(prefix="/api/v1/tokens", tags=["tokens"])


class TokenCreate(BaseModel):
    name: str = Field(..., min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._@-]*$")
    role: str = Field(..., pattern="^(agent|viewer|operator|admin)$")
    cluster: str | None = Field(None, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    node: str | None = Field(None, max_length=255, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@router.get("")
async def list_tokens(engine: EngineDep, _: AdminDep) -> list[dict[str, Any]]:
    return await run_in_threadpool(tokens.list_tokens, engine)


@router.post("", status_code=201)
async def create_token(body: TokenCreate, engine: EngineDep, who: AdminDep) -> dict[str, Any]:
    def make(e: Engine) -> str:
        return tokens.create_token(e, body.name, body.role, body.cluster, body.node)

    try:
        raw = await run_in_threadpool(make, engine)
    except ValueError as e:
        raise HTTPException(422, str(e)) from None
    return {"name": body.name, "role": body.role, "cluster": body.cluster, "node": body.node, "token": raw,
            "created_by": who.name, "note": "shown once: the server keeps only its hash"}


@router.delete("/{name}")
async def revoke(engine: EngineDep, _: AdminDep, name: str = PathParam(max_length=128)) -> dict[str, Any]:
    if not await run_in_threadpool(tokens.revoke_token, engine, name):
        raise HTTPException(404, f"no live token named {name!r}")
    return {"name": name, "revoked": True}
