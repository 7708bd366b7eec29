"""``POST /api/v1/gpus/{uuid}/move`` (admin): give a GPU to another cluster's node, the same
operation as ``gpufleet gpu move`` (``storage.scope.move_gpu``). A GPU uuid belongs to one
cluster until this is done: another cluster's agents reporting it are refused."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi import Path as PathParam
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from gpufleet.api.deps import AdminDep, EngineDep
from gpufleet.storage import scope

router = APIRouter(prefix="/api/v1/gpus", tags=["gpus"])


class GpuMoveTo(BaseModel):
    cluster: str = Field(..., min_length=1, max_length=128, pattern=r"^[^\x00-\x1f]+$")
    node: str = Field(..., min_length=1, max_length=255, pattern=r"^[^\x00-\x1f]+$")


@router.post("/{uuid}/move", responses={404: {"description": "no GPU has this uuid"}})
async def move(request: Request, body: GpuMoveTo, engine: EngineDep, _: AdminDep,
               uuid: str = PathParam(max_length=96, pattern=r"^[^\x00-\x1f]+$")) -> dict[str, Any]:
    m = await run_in_threadpool(scope.move_gpu, engine, uuid, body.cluster, body.node)
    if m is None:
        raise HTTPException(404, f"no GPU with uuid {uuid!r}")
    # This process's collector forgets what it remembered of the GPU's node, so the old node is
    # refused at once here; other processes re-read it within storage.write_cache.GPU_SEEN_EVERY_S.
    coll = getattr(request.app.state, "collector", None)
    if coll is not None:
        coll.writer.cache.gpus.pop(uuid, None)
    return {"uuid": uuid, "from": {"cluster": m.from_cluster, "node": m.from_node},
            "to": {"cluster": m.to_cluster, "node": m.to_node}}
