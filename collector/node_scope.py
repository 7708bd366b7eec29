"""The collector's side of ``storage.scope`` for batches sent with a node-scoped token: the
records it may not write (a job description, progress window or collective of a job not on
its GPUs, or a change of who a shared job is blamed on) are refused by themselves with 403,
in the same partial answer as the intake schema's refusals; the rest of the batch is stored."""

from __future__ import annotations

import time

import msgspec
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError
from starlette.concurrency import run_in_threadpool

from gpufleet.collector.errors import BatchRejected, Rejection
from gpufleet.collector.writer import Unavailable
from gpufleet.protocol import Batch
from gpufleet.storage import scope
from gpufleet.storage.errors import is_transient, is_unreachable
from gpufleet.storage.prepared import Prepared


async def screen_node_scope(engine: Engine, facts: scope.NodeFactsCache, prep: Prepared) -> list[Rejection]:
    """Drop from ``prep.batch`` what its node may not write; the refusals (403 each). Raises
    BatchRejected when nothing of the batch is left, Unavailable when the database is."""
    batch = prep.batch
    if not (batch.jobs or batch.progress or batch.collectives):
        return []
    if not scope.needs_facts(batch, prep.job):
        return []
    changes, refusals = scope.screen_node_records(batch, prep.job, await _facts(engine, facts, batch, False))
    if refusals:  # decided on what the database says now, not on a cached read
        changes, refusals = scope.screen_node_records(batch, prep.job, await _facts(engine, facts, batch, True))
    if not refusals:
        return []
    prep.batch = msgspec.structs.replace(batch, **changes)
    out = [Rejection(403, r.message, r.part, r.field, r.row) for r in refusals]
    b = prep.batch
    if not (prep.n or b.gpus or b.jobs or b.allocations or b.events or b.progress or b.collectives or b.nics
            or b.gpu_nics):
        raise BatchRejected(out[0])
    return out


async def _facts(engine: Engine, facts: scope.NodeFactsCache, batch: Batch, fresh: bool) -> scope.NodeFacts:
    a, jobs, now = batch.agent, [j.job_id for j in batch.jobs], time.time()
    hit = None if fresh else facts.cached(a.cluster, a.node, jobs, now)
    if hit is not None:  # the usual case: no thread hop on the ingest hot path
        return hit
    try:
        return await run_in_threadpool(facts.get, engine, a.cluster, a.node, jobs, now, fresh)
    except DBAPIError as e:
        if not (is_transient(e) or is_unreachable(e)):
            raise
        raise Unavailable("database unavailable, retry later") from None
