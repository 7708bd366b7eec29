"""Node and GPU events (XID, ECC, NVLink, fell off the bus) into ``events``: the first
section writer (see ``storage.writes.SECTION_WRITERS``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpufleet.storage.models import Event

if TYPE_CHECKING:
    from gpufleet.storage.writes import WriteContext


def write_events(ctx: WriteContext) -> None:
    rows = [{"ts": e.ts, "node_id": ctx.node_pks[i], "gpu_pk": ctx.gpu_pks.get(e.gpu_uuid) if e.gpu_uuid else None,
             "kind": e.kind, "code": e.code, "message": e.message}
            for i in ctx.active for e in ctx.preps[i].batch.events]
    if rows:
        ctx.conn.execute(Event.__table__.insert(), rows)
