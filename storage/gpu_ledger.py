"""The ``gpu_ledger`` table: each analysed job's GPU-time ledger folded per (job, minute,
category) (analysis/ledger.py, docs/goodput.md "The ledger"). Written by the analysis runner
with the job's report; read by the fleet ledger (``GET /api/v1/fleet/ledger``), which only sums
rows and never re-derives them. (Not the ingest idempotency ledger: that is storage/ledger.py.)

A row per category with GPU-seconds in the minute; zero categories have no row. Defined on the
shared ``Base`` (imported at the end of storage/models.py); created by migration 0015."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from sqlalchemy import Double, ForeignKey, Index, Integer, String, delete, select
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Mapped, mapped_column

from gpufleet.storage.models import Base

ROUND = 3  # GPU-seconds kept to the millisecond: a rewrite with the same ledger changes nothing


class GpuLedgerMinute(Base):
    __tablename__ = "gpu_ledger"
    __table_args__ = (Index("ix_gpu_ledger_minute", "minute"),)
    job_pk: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    minute: Mapped[int] = mapped_column(Integer, primary_key=True)  # floor(ts / 60)
    category: Mapped[str] = mapped_column(String(32), primary_key=True)
    gpu_s: Mapped[float] = mapped_column(Double)


def rows_of(b0: int, per_minute: Mapping[str, np.ndarray]) -> dict[tuple[int, str], float]:
    """(minute, category) -> GPU-seconds, the non-zero ones."""
    out: dict[tuple[int, str], float] = {}
    for cat, v in per_minute.items():
        r = np.round(np.asarray(v, dtype=np.float64), ROUND)
        for j in np.flatnonzero(r > 0).tolist():
            out[(b0 + j, cat)] = float(r[j])
    return out


def write_job_ledger(conn: Connection, job_pk: int, b0: int, per_minute: Mapping[str, np.ndarray]) -> int:
    """Replace the job's stored ledger with ``per_minute`` (category -> GPU-seconds of minutes
    ``b0 ..``), writing only the rows that changed (a running job's pass changes its newest
    minutes). Returns rows written or deleted."""
    t = GpuLedgerMinute.__table__
    new = rows_of(b0, per_minute)
    old = {(int(m), str(c)): float(s) for m, c, s in conn.execute(
        select(t.c.minute, t.c.category, t.c.gpu_s).where(t.c.job_pk == job_pk))}
    # Minutes whose rows differ in any way are rewritten whole (delete by minute, insert its
    # rows): integer IN lists, and a running job's pass touches only its newest minutes.
    changed = {m for (m, c), v in new.items() if (m, c) in old and abs(old[(m, c)] - v) > 10 ** -ROUND}
    minutes = sorted({m for m, _ in old.keys() ^ new.keys()} | changed)
    for i in range(0, len(minutes), 500):
        conn.execute(delete(t).where(t.c.job_pk == job_pk, t.c.minute.in_(minutes[i:i + 500])))
    redo = set(minutes)
    ins = [{"job_pk": job_pk, "minute": m, "category": c, "gpu_s": v} for (m, c), v in new.items() if m in redo]
    if ins:
        conn.execute(t.insert(), ins)
    return len(ins)


def read_job_ledger(conn: Connection, job_pk: int) -> list[tuple[int, str, float]]:
    t = GpuLedgerMinute.__table__
    return [(int(m), str(c), float(s)) for m, c, s in conn.execute(
        select(t.c.minute, t.c.category, t.c.gpu_s).where(t.c.job_pk == job_pk).order_by(t.c.minute, t.c.category))]
