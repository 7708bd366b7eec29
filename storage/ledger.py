"""The idempotency ledger (``ingest_batches``): one row per (boot_id, seq) stored. Inserting
the keys first, inside the write transaction, decides which batches are new; a concurrent
writer inserting the same key blocks on it until the first commits, then sees a conflict."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection

from gpufleet.storage.dialect import is_postgres


def ledger_insert(conn: Connection, ledger: list[dict[str, Any]]) -> set[tuple[str, int]]:
    """Insert idempotency keys; returns those that were new (not stored before)."""
    cols = ("boot_id", "seq", "node_id", "received_at", "rows")
    vals = [[r[c] for r in ledger] for c in cols]
    tail = "ON CONFLICT (boot_id, seq) DO NOTHING RETURNING boot_id, seq"
    if is_postgres(conn):
        sql = (f"INSERT INTO ingest_batches ({', '.join(cols)}) SELECT * FROM "
               f"unnest(%s::text[], %s::int8[], %s::int4[], %s::float8[], %s::int4[]) {tail}")
        rows = conn.exec_driver_sql(sql, tuple(vals)).all()
    else:
        rows = []
        for i in range(0, len(ledger), 1000):  # SQLite caps bound variables per statement
            part = ledger[i:i + 1000]
            sql = f"INSERT INTO ingest_batches ({', '.join(cols)}) VALUES " \
                  + ", ".join(["(?, ?, ?, ?, ?)"] * len(part)) + f" {tail}"
            rows += conn.exec_driver_sql(sql, tuple(r[c] for r in part for c in cols)).all()
    return {(b, int(q)) for b, q in rows}
