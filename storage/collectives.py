"""Store protocol ``collectives``, ``nics`` and ``gpu_nics`` (docs/nccl.md) inside the batch's
transaction: a section writer for ``storage.writes.SECTION_WRITERS``.

``check_fabric(batch)`` is the structural check the struct types cannot express (finite,
non-negative, plausible times, bounded sizes); it raises ``FabricRejected`` naming the part,
row and field, which the collector answers as a permanent 422 (nothing is half-stored: the
check runs before the write). ``write_fabric(ctx)`` runs after the batch's idempotency key is
in, so a retried batch stores its rows once.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection

from gpufleet.protocol import Batch

from .collectives_models import CollectiveWindow, GpuNicRow, NicSampleRow
from .dimensions import insert_for, job_ids

if TYPE_CHECKING:
    from .writes import WriteContext

MAX_COLLECTIVES_PER_BATCH = 200_000  # 8 GPUs x 4 comms x 40 size buckets x 10 s windows, with room
MAX_NICS_PER_BATCH = 10_000
# counter names that count faults; their increases add up to ``nic_samples.errors``
ERROR_COUNTERS = frozenset({"port_rcv_errors", "symbol_error", "link_downed", "local_link_integrity_errors",
                            "excessive_buffer_overrun_errors", "port_rcv_remote_physical_errors",
                            "link_error_recovery", "packet_seq_err", "out_of_sequence", "local_ack_timeout_err"})


class FabricRejected(ValueError):
    """A collectives/nics/gpu_nics entry that can never be stored (the message names it)."""

    def __init__(self, part: str, row: int, field: str, message: str) -> None:
        super().__init__(f"{part}[{row}].{field}: {message}")
        self.part, self.row, self.field, self.message = part, row, field, message


def _ok_ts(v: float) -> bool:
    return 946684800 < v < 4102444800


def _nonneg(v: float | None) -> bool:
    return v is None or (math.isfinite(v) and v >= 0)


def check_fabric(batch: Batch) -> None:
    if len(batch.collectives) > MAX_COLLECTIVES_PER_BATCH:
        raise FabricRejected("collectives", 0, "", f"{len(batch.collectives)} rows, at most "
                             f"{MAX_COLLECTIVES_PER_BATCH} per batch")
    for i, c in enumerate(batch.collectives):
        if not _ok_ts(c.ts):
            raise FabricRejected("collectives", i, "ts", f"{c.ts} is not a plausible epoch time")
        if not (0 < c.window_s <= 3600):
            raise FabricRejected("collectives", i, "window_s", f"{c.window_s} must be in (0, 3600]")
        if not c.comm or len(c.comm) > 64 or not c.coll or len(c.coll) > 64:
            raise FabricRejected("collectives", i, "comm", "comm and coll must be 1-64 characters")
        if c.count < 1 or c.rank < -1 or c.size_bucket < 0 or c.size_bucket > 1 << 50:
            raise FabricRejected("collectives", i, "count", "count >= 1, rank >= -1, size_bucket in [0, 2^50]")
        for name in ("bytes", "exec_us_p50", "exec_us_p95", "exec_us_max", "busbw_gbs_p50"):
            v = getattr(c, name)
            if not _nonneg(v):
                raise FabricRejected("collectives", i, name, f"{v} must be finite and >= 0")
        if c.job_id is not None and not (0 < len(c.job_id) <= 255):
            raise FabricRejected("collectives", i, "job_id", "must be 1-255 characters")
    if len(batch.nics) > MAX_NICS_PER_BATCH:
        raise FabricRejected("nics", 0, "", f"{len(batch.nics)} rows, at most {MAX_NICS_PER_BATCH} per batch")
    for i, n in enumerate(batch.nics):
        if not _ok_ts(n.ts):
            raise FabricRejected("nics", i, "ts", f"{n.ts} is not a plausible epoch time")
        if not n.nic or len(n.nic) > 64:
            raise FabricRejected("nics", i, "nic", "must be 1-64 characters")
        if not (0 < n.interval_s <= 86400):
            raise FabricRejected("nics", i, "interval_s", f"{n.interval_s} must be in (0, 86400]")
        for name in ("rate_gbps", "tx_bytes_s", "rx_bytes_s"):
            if not _nonneg(getattr(n, name)):
                raise FabricRejected("nics", i, name, f"{getattr(n, name)} must be finite and >= 0")
        for k, v in n.counters.items():
            if len(k) > 64 or not _nonneg(v):
                raise FabricRejected("nics", i, f"counters.{k[:64]}", f"{v} must be finite and >= 0")
    for i, g in enumerate(batch.gpu_nics):
        if not g.nic or len(g.nic) > 64 or g.mode not in ("pcie", "numa", "node"):
            raise FabricRejected("gpu_nics", i, "nic", "nic 1-64 characters, mode pcie|numa|node")


def _short(s: str | None, n: int) -> str | None:
    return s[:n] if s else None


def write_fabric(ctx: WriteContext) -> None:
    """The section writer: rows for every active batch's collectives, nics and gpu_nics."""
    conn = ctx.conn
    # jobs named only by collectives (dump directory name) get a bare row like any reference
    missing = {(ctx.cluster_pks[i], c.job_id): None for i in ctx.active for c in ctx.preps[i].batch.collectives
               if c.job_id is not None and ctx.job_pk_of(i, c.job_id) is None}
    extra = job_ids(conn, dict(sorted(missing.items())), ctx.cache) if missing else {}
    colls: list[dict[str, Any]] = []
    nics: list[dict[str, Any]] = []
    rails: dict[tuple[int, str], dict[str, Any]] = {}
    for i in ctx.active:
        b = ctx.preps[i].batch
        node = ctx.node_pks[i]
        cid = ctx.cluster_pks[i]
        for c in b.collectives:
            job = None if c.job_id is None else (ctx.job_pk_of(i, c.job_id) or extra.get((cid, c.job_id)))
            colls.append({
                "job_pk": job, "node_id": node, "gpu_pk": ctx.gpu_pks.get(c.gpu_uuid) if c.gpu_uuid else None,
                "ts": c.ts, "window_s": c.window_s, "comm": c.comm, "rank": c.rank, "n_ranks": c.n_ranks,
                "n_nodes": c.n_nodes, "coll": c.coll, "size_bucket": c.size_bucket, "count": c.count,
                "bytes": c.bytes, "exec_us_p50": c.exec_us_p50, "exec_us_p95": c.exec_us_p95,
                "exec_us_max": c.exec_us_max, "busbw_gbs_p50": c.busbw_gbs_p50, "pid": c.pid,
                "timing_source": _short(c.timing_source, 32)})
        for n in b.nics:
            errs = [v for k, v in n.counters.items() if k in ERROR_COUNTERS]
            nics.append({
                "node_id": node, "ts": n.ts, "nic": n.nic, "interval_s": n.interval_s,
                "link_layer": _short(n.link_layer, 32), "state": _short(n.state, 32), "rate_gbps": n.rate_gbps,
                "tx_bytes_s": n.tx_bytes_s, "rx_bytes_s": n.rx_bytes_s, "xmit_wait": n.counters.get("port_xmit_wait"),
                "errors": sum(errs) if errs else None, "counters": dict(n.counters) or None})
        for g in b.gpu_nics:
            gpu = ctx.gpu_pks.get(g.gpu_uuid)
            if gpu is not None:  # a GPU the node never reported has no row to hang it on
                rails[(gpu, g.nic)] = {"gpu_pk": gpu, "node_id": node, "nic": g.nic, "mode": g.mode,
                                       "seen_ts": ctx.now}
    if colls:
        conn.execute(CollectiveWindow.__table__.insert(), colls)
    if nics:
        conn.execute(NicSampleRow.__table__.insert(), nics)
    if rails:
        _upsert_rails(conn, [rails[k] for k in sorted(rails)])


def _upsert_rails(conn: Connection, rows: list[dict[str, Any]]) -> None:
    ins = insert_for(conn, GpuNicRow.__table__)
    conn.execute(ins.on_conflict_do_update(index_elements=["gpu_pk", "nic"], set_={
        "node_id": ins.excluded.node_id, "mode": ins.excluded.mode, "seen_ts": ins.excluded.seen_ts}), rows)
