"""Migration 0014: every DELETE that retention runs row by row finds its rows through an index
leading with its time column (PostgreSQL EXPLAIN, SQLite EXPLAIN QUERY PLAN), not a scan of
the whole table; down and up again; retention still deletes exactly the expired rows."""

from __future__ import annotations

from sqlalchemy import inspect, text

from gpufleet.storage.db import make_engine
from gpufleet.storage.migrate import downgrade, upgrade
from gpufleet.storage.retention import FEATURE_TABLES, ROLLUP_TABLES, ROW_PRUNED, apply_retention

# The statements apply_retention runs (storage/retention.py), by table.
DELETES = {
    **{t: f"DELETE FROM {t} WHERE {col} < 1000" for t, col in FEATURE_TABLES.items()},
    **{t: f"DELETE FROM {t} WHERE {col} < 1000{only}" for t, (col, _, only) in ROW_PRUNED.items()},
}
# On SQLite also the raw blocks (by their end, t1) and the rollups (PostgreSQL drops partitions).
SQLITE_DELETES = {
    "gpu_sample_blocks": "DELETE FROM gpu_sample_blocks WHERE t1 < 1000",
    **{t: f"DELETE FROM {t} WHERE {col} < 1000" for t, col in ROLLUP_TABLES.items()},
}


def _index(table: str, sql: str) -> str:
    """The index migration 0014 gives ``table`` for its DELETE: named for its time column (the
    outbox's for its state, then its time column)."""
    col = sql.split(" WHERE ", 1)[1].split(" ", 1)[0]
    return f"ix_{table}_state_{col}" if table == "alert_outbox" else f"ix_{table}_{col}"


def test_postgresql_retention_deletes_use_a_time_index(pg_url: str) -> None:
    e = make_engine(pg_url)
    try:
        with e.begin() as c:
            c.execute(text("SET LOCAL enable_seqscan = off"))  # the tables are empty: make the planner show its path
            for table, sql in DELETES.items():
                col = sql.split(" WHERE ", 1)[1].split(" ", 1)[0]
                plan = "\n".join(r[0] for r in c.execute(text("EXPLAIN " + sql)))
                cond = next((ln for ln in plan.splitlines() if "Index Cond:" in ln), "")
                assert "Seq Scan" not in plan and f" {_index(table, sql)} " in plan, (table, plan)
                assert f"({col} <" in cond, (table, plan)  # the time range is the lookup, not a filter
    finally:
        e.dispose()


def test_sqlite_retention_deletes_use_a_time_index(sqlite_url: str) -> None:
    e = make_engine(sqlite_url)
    try:
        with e.connect() as c:
            for table, sql in {**DELETES, **SQLITE_DELETES}.items():
                col = sql.split(" WHERE ", 1)[1].split(" ", 1)[0]
                (plan,) = [r[3] for r in c.execute(text("EXPLAIN QUERY PLAN " + sql))]
                assert plan.startswith(f"SEARCH {table} USING ") and f"INDEX {_index(table, sql)} (" in plan, plan
                assert f"{col}<?)" in plan, plan
    finally:
        e.dispose()


def _indexes(url: str) -> set[str]:
    e = make_engine(url)
    try:
        insp = inspect(e)
        return {i["name"] for t in {**DELETES, **SQLITE_DELETES} for i in insp.get_indexes(t) if i["name"]}
    finally:
        e.dispose()


def test_down_and_up_again(database_url: str) -> None:
    pg = database_url.startswith("postgresql")
    ours = {_index(t, s) for t, s in (DELETES if pg else {**DELETES, **SQLITE_DELETES}).items()}
    assert ours <= _indexes(database_url)
    downgrade(database_url, "0013")
    assert not ours & _indexes(database_url)
    upgrade(database_url)
    assert ours <= _indexes(database_url)
    if pg:  # the concurrent builds finished: no invalid index left behind
        e = make_engine(database_url)
        with e.connect() as c:
            assert c.execute(text("SELECT count(*) FROM pg_index WHERE NOT indisvalid")).scalar_one() == 0
        e.dispose()


def test_retention_deletes_the_expired_rows_only(database_url: str) -> None:
    """With the indexes the same rows go: an event and an ingest-ledger row on each side of the
    cutoff, only the old ones deleted."""
    e = make_engine(database_url)
    day = 86400
    now = 1_790_000_000.0
    try:
        with e.begin() as c:
            node = c.execute(text("INSERT INTO nodes (cluster_id, name, last_seen) SELECT id, 'n-ret', :t "
                                  "FROM clusters WHERE name = 'default' RETURNING id"), {"t": now}).scalar_one()
            for ts in (now - 40 * day, now - 1):
                c.execute(text("INSERT INTO ingest_batches (boot_id, seq, node_id, received_at, rows) "
                               "VALUES ('b', :s, :n, :t, 1)"), {"s": int(ts), "n": node, "t": ts})
                c.execute(text("INSERT INTO events (node_id, ts, kind, message) VALUES (:n, :t, 'xid', '')"),
                          {"n": node, "t": ts - 400 * day + 39 * day})
        out = apply_retention(e, now, raw_days=31, rollup_days=400)
        assert out["ingest_batches"] == 1 and out["events"] == 1, out
        with e.connect() as c:
            assert [r[0] for r in c.execute(text("SELECT received_at FROM ingest_batches"))] == [now - 1]
            assert c.execute(text("SELECT count(*) FROM events")).scalar_one() == 1
    finally:
        e.dispose()
