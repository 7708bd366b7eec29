"""Store protocol ``progress`` windows (docs/progress.md) inside the batch's transaction: a
section writer (``storage.writes.SECTION_WRITERS``), run after the batch's idempotency key is
in, so a retried batch is a duplicate before it gets here and its windows are stored once.
The windows' values were bounded at decode (``protocol.ProgressWindow``). A job known only from
its progress (no GPU on the node attributed to it) gets a bare job row, like a job that samples
merely reference.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection

from gpufleet.protocol import Batch, ProgressWindow
from gpufleet.storage.dimensions import job_ids
from gpufleet.storage.progress_models import JobProgress

if TYPE_CHECKING:
    from gpufleet.storage.writes import WriteContext

_TABLE = JobProgress.__table__


def progress_job_ids(batch: Batch) -> set[str]:
    return {w.job_id for w in batch.progress}


def _row(node_id: int | None, job_pk: int, w: ProgressWindow) -> dict[str, Any]:
    return {
        "job_pk": job_pk, "node_id": node_id, "rank": w.rank, "pid": w.pid, "host": (w.host or None) and w.host[:255],
        "gpu": (w.gpu or None) and w.gpu[:96], "local_rank": w.local_rank, "world_size": w.world_size,
        "start_ts": w.start, "end_ts": w.end, "steps": w.steps, "first_step": w.first_step,
        "last_step": w.last_step, "max_step": w.max_step, "restarts": w.restarts, "lost_steps": w.lost_steps,
        "tokens": w.tokens, "samples": w.samples, "productive_s": w.productive_s, "stall_s": w.stall_s,
        "unfinished_s": w.unfinished_s, "spans": dict(w.spans) or None, "span_counts": dict(w.span_counts) or None,
        "step_time_p50_s": w.step_time_p50_s, "step_time_p95_s": w.step_time_p95_s,
        "step_time_max_s": w.step_time_max_s, "step_hist": dict(w.step_hist) or None,
        "last_step_ts": w.last_step_ts, "since_step_s": w.since_step_s,
        "open_span": (w.open_span or None) and w.open_span[:64], "open_span_s": w.open_span_s, "alive": w.alive,
        "ended": w.ended, "process_start": w.process_start, "flops_per_step": w.flops_per_step,
        "params": w.params, "dropped": w.dropped,
        "events": {"events": w.events, "dropped": w.events_dropped} if (w.events or w.events_dropped) else None,
    }


def write_progress(conn: Connection, windows: Iterable[tuple[int | None, int, ProgressWindow]]) -> int:
    """Insert ``(node_id, job_pk, window)`` rows in the caller's transaction; returns the count."""
    rows = [_row(n, j, w) for n, j, w in windows]
    if rows:
        conn.execute(_TABLE.insert(), rows)
    return len(rows)


def write_progress_section(ctx: WriteContext) -> None:
    """The section writer: every active batch's ``progress`` windows."""
    if not any(ctx.preps[i].batch.progress for i in ctx.active):
        return
    missing = {(ctx.cluster_pks[i], w.job_id): None for i in ctx.active for w in ctx.preps[i].batch.progress
               if ctx.job_pk_of(i, w.job_id) is None}
    extra = job_ids(ctx.conn, dict(sorted(missing.items())), ctx.cache) if missing else {}
    rows: list[tuple[int | None, int, ProgressWindow]] = []
    for i in ctx.active:
        for w in ctx.preps[i].batch.progress:
            pk = ctx.job_pk_of(i, w.job_id)
            rows.append((ctx.node_pks[i], pk if pk is not None else extra[(ctx.cluster_pks[i], w.job_id)], w))
    write_progress(ctx.conn, rows)
