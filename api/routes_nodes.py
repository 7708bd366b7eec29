"""/api/v1/nodes and /api/v1/gpus: current state, what runs there, health events, throttling."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query

from .metrics import TimedRoute
from .queries.common import DEFAULT_CLUSTER, parse_time
from .queries.node_history import NODE_FIELDS, find_node, node_timeseries
from .queries.nodes import gpu_detail, list_nodes, node_detail
from .queries.timeseries import parse_fields
from .routes_common import SAFE, ClusterFilter, ClusterQ, Cursor, NamePath, SessionDep
from .schemas import GpuDetail, Message, NodeDetail, NodesPublic, NodeTimeseriesPublic

router = APIRouter(prefix="/api/v1", tags=["nodes"], route_class=TimedRoute,
                   responses={400: {"model": Message, "description": "an argument is invalid (detail says which)"}})


@router.get("/nodes", response_model=NodesPublic, summary="Nodes with their GPUs and current values")
def read_nodes(session: SessionDep, cluster: ClusterFilter = None,
               limit: Annotated[int, Query(ge=1, le=2000)] = 200, cursor: Cursor = None) -> Any:
    return list_nodes(session, cluster=cluster, limit=limit, cursor=cursor)


@router.get("/nodes/{name}", response_model=NodeDetail, summary="One node: GPUs, throttling, XID/ECC events",
            responses={404: {"description": "no such node"}})
def read_node(name: NamePath, session: SessionDep, cluster: ClusterQ = DEFAULT_CLUSTER) -> Any:
    d = node_detail(session, cluster, name)
    if d is None:
        raise HTTPException(404, f"no node {name!r} in cluster {cluster!r}")
    return d


@router.get("/nodes/{name}/timeseries", response_model=NodeTimeseriesPublic,
            summary="Per-GPU series of one node, downsampled on the server from 1-minute rollups",
            responses={404: {"description": "no such node"}})
def read_node_timeseries(
    name: NamePath, session: SessionDep, cluster: ClusterQ = DEFAULT_CLUSTER,
    fields: Annotated[str | None, Query(max_length=1024, pattern=SAFE,
                                        description=f"comma-separated catalog fields; default {','.join(NODE_FIELDS)}")]
    = None,
    step: Annotated[str, Query(max_length=16, pattern=r"^(auto|\d{1,8})$",
                               description="auto (about 360 points) or seconds (>= 60)")] = "auto",
    start: Annotated[str | None, Query(max_length=64, pattern=SAFE, description="epoch, ISO-8601 or -24h")] = None,
    end: Annotated[str | None, Query(max_length=64, pattern=SAFE, description="epoch, ISO-8601 or -1h")] = None,
) -> Any:
    node = find_node(session, cluster, name)
    if node is None:
        raise HTTPException(404, f"no node {name!r} in cluster {cluster!r}")
    return node_timeseries(session, node, fields=parse_fields(fields or ",".join(NODE_FIELDS)), step=step,
                           start=parse_time(start, name="start"), end=parse_time(end, name="end"))


@router.get("/gpus/{uuid}", response_model=GpuDetail, summary="One GPU: current values, jobs, events",
            responses={404: {"description": "no such GPU"}})
def read_gpu(uuid: NamePath, session: SessionDep) -> Any:
    d = gpu_detail(session, uuid)
    if d is None:
        raise HTTPException(404, f"no GPU {uuid!r}")
    return d
