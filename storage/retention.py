"""Daily partitions (PostgreSQL) and retention (both databases).

On PostgreSQL the raw blocks ``gpu_sample_blocks`` (on ``t0``) and the two 1-minute rollup
tables (on ``bucket``) are declaratively range-partitioned by UTC day. Partitions are created ahead of time by the
collector's maintenance loop and on demand for older data (imports, spooled batches), each
in its own short transaction: ``CREATE TABLE .. PARTITION OF`` takes a strong lock on the
parent, which must never be requested from inside a write transaction that already holds a
weaker one (that is how concurrent writers deadlock). Retention drops whole partitions,
which costs nothing like a ``DELETE``; SQLite deletes rows instead. Raw retention may be
a fraction of a day (``raw_days = 0.25`` keeps 6 hours): the raw blocks ending before the
cutoff in the day that holds it are deleted too (a few rows per GPU-window, not samples)."""

from __future__ import annotations

import datetime as dt
import logging
import re
import threading
from collections.abc import Iterable
from typing import Any

import numpy as np
from sqlalchemy import Connection, Engine, text

from gpufleet.storage.dialect import is_postgres
from gpufleet.storage.sessions import purge_expired

log = logging.getLogger(__name__)

DAY = 86400
RAW_TABLES = {"gpu_sample_blocks": "t0"}
# A raw block is expired when its last sample is (t1): blocks never cross a day, so the
# partition of day d holds only blocks with t1 < d + DAY.
_EXPIRED_BY = {"gpu_sample_blocks": "t1"}
ROLLUP_TABLES = {"gpu_samples_1m": "bucket", "job_samples_1m": "bucket"}
PARTITIONED = {**RAW_TABLES, **ROLLUP_TABLES}
# Minute features folded at ingest (what the analysis reads): kept as long as the 1-minute
# rollups (the same setting), rows deleted on both databases (not partitioned). The hour
# histograms go only once their whole hour is past the cutoff.
FEATURE_TABLES = {"gpu_minute_features": "bucket", "job_hist_features": "hour"}
# Tables pruned row by row on both databases (not partitioned): table -> (its time column,
# the horizon it is kept for, an extra condition). "raw" tables hold per-window detail at the
# raw samples' rate (a row per rank, NIC or collective every 10 s) and go with them; the few,
# cited rows (events) go with the rollups. A progress window, collective window or NIC sample
# goes once it ended (end_ts / its ts) before the cutoff. The alert outbox keeps every row not
# yet delivered or given up on; the idempotency ledger only needs to outlive any retry. Each is a
# DELETE that scans the table when no index leads with its time column (docs/collector.md).
ROW_PRUNED: dict[str, tuple[str, str, str]] = {
    "ingest_batches": ("received_at", "raw", ""),
    "job_progress": ("end_ts", "raw", ""),
    "collective_windows": ("ts", "raw", ""),
    "nic_samples": ("ts", "raw", ""),
    "alert_outbox": ("created_at", "raw", " AND state IN ('sent', 'failed')"),
    "events": ("ts", "rollup", ""),
}
_NAME_RE = re.compile(r"^(?P<table>[a-z0-9_]+)_p(?P<day>\d{8})$")

# (database url, table, day) already known to exist; per process.
_known: set[tuple[str, str, int]] = set()
_known_lock = threading.Lock()


def day_of(ts: float) -> int:
    """Epoch seconds at the start of the UTC day holding ``ts``."""
    return int(ts // DAY) * DAY


def days_of(ts: Any) -> set[int]:
    """The UTC day starts covered by an array of timestamps."""
    if not len(ts):
        return set()
    a = np.asarray(ts)
    lo, hi = int(np.floor(a.min() / DAY)), int(np.floor(a.max() / DAY))
    if hi - lo <= 1:  # the usual case (a group commit spans seconds): no sort needed
        return {lo * DAY, hi * DAY}
    return {int(d) * DAY for d in np.unique(np.floor(a / DAY))}


def partition_name(table: str, day: int) -> str:
    return f"{table}_p{dt.datetime.fromtimestamp(day, dt.UTC):%Y%m%d}"


def forget(url: str | None = None) -> None:
    """Drop the cache of known partitions (after a 'no partition for row' error)."""
    with _known_lock:
        if url is None:
            _known.clear()
        else:
            for k in [k for k in _known if k[0] == url]:
                _known.discard(k)


def missing_days(url: str, days: Iterable[int], tables: Iterable[str] = PARTITIONED) -> list[tuple[str, int]]:
    with _known_lock:
        return [(t, d) for d in sorted(set(days)) for t in tables if (url, t, d) not in _known]


def create_partition_sql(table: str, day: int) -> str:
    # Rollup rows are updated in place every few seconds (each batch folds into its
    # GPU-minute row): free space in each page lets PostgreSQL make those HOT updates
    # instead of new index entries and page splits.
    storage = " WITH (fillfactor = 70)" if table in ROLLUP_TABLES else ""
    return (f'CREATE TABLE IF NOT EXISTS "{partition_name(table, day)}" PARTITION OF "{table}" '
            f"FOR VALUES FROM ({day}) TO ({day + DAY}){storage}")


def ensure_partitions(engine: Engine, days: Iterable[int], tables: Iterable[str] = PARTITIONED) -> int:
    """Create the daily partitions covering ``days`` (epoch day starts) when absent, each in
    its own transaction. A no-op on SQLite. Returns how many were created."""
    if not is_postgres(engine):
        return 0
    url = engine.url.render_as_string(hide_password=True)
    todo = missing_days(url, days, tables)
    created = 0
    for table, day in todo:
        name = partition_name(table, day)
        sql = create_partition_sql(table, day)
        for attempt in range(3):
            try:
                with engine.begin() as c:
                    # Serialise creators across processes: concurrent IF NOT EXISTS can still
                    # collide on the catalog's unique indexes.
                    c.execute(text("SELECT pg_advisory_xact_lock(hashtext(:n))"), {"n": name})
                    exists = c.execute(text("SELECT to_regclass(:n) IS NOT NULL"), {"n": name}).scalar()
                    if not exists:
                        c.execute(text(sql))
                        created += 1
                break
            except Exception:
                if attempt == 2:
                    raise
                log.debug("retrying partition %s", name, exc_info=True)
        with _known_lock:
            _known.add((url, table, day))
    return created


def ensure_partitions_in(conn: Connection, days: Iterable[int]) -> None:
    """Inside a write transaction (PostgreSQL): create the partitions for ``days`` that this
    process does not know to exist. Normally a no-op, because the caller created them ahead
    with ``ensure_partitions``; this covers a day that another process's retention dropped
    or that a rolled-back transaction never committed."""
    url = conn.engine.url.render_as_string(hide_password=True)
    todo = missing_days(url, days)
    for table, day in todo:
        name = partition_name(table, day)
        conn.execute(text("SELECT pg_advisory_xact_lock(hashtext(:n))"), {"n": name})
        conn.execute(text(create_partition_sql(table, day)))
    # Marked known only by the caller's successful commit would be exact; marking now is
    # safe because a rollback leaves "no partition for row" errors (errors.is_missing_partition),
    # on which the writer calls ``forget`` and retries.
    with _known_lock:
        for table, day in todo:
            _known.add((url, table, day))


def ensure_ahead(engine: Engine, now: float, days_ahead: int = 2) -> int:
    """Today's partitions and the next ``days_ahead`` days' (the maintenance loop calls this)."""
    today = day_of(now)
    return ensure_partitions(engine, [today + i * DAY for i in range(-1, days_ahead + 1)])


def list_partitions(conn: Connection, table: str) -> list[tuple[str, int]]:
    """(partition name, day) for each daily partition of ``table`` (PostgreSQL)."""
    rows = conn.execute(text(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = :t ORDER BY c.relname"), {"t": table}).scalars()
    out = []
    for name in rows:
        m = _NAME_RE.match(name)
        if m and m["table"] == table:
            day = int(dt.datetime.strptime(m["day"], "%Y%m%d").replace(tzinfo=dt.UTC).timestamp())
            out.append((name, day))
    return out


def apply_retention(engine: Engine, now: float, raw_days: float, rollup_days: float) -> dict[str, int]:
    """Remove raw samples older than ``raw_days``, rollups and minute features older than
    ``rollup_days``, the ``ROW_PRUNED`` tables past their horizon, and expired web sessions.
    PostgreSQL drops whole day partitions (only days entirely before the cutoff); SQLite deletes
    rows; the other tables' rows are deleted on both. Returns partitions dropped (PostgreSQL) or
    rows deleted (SQLite, and the row-pruned tables) per table."""
    out: dict[str, int] = {}
    cutoffs = {t: now - raw_days * DAY for t in RAW_TABLES} | {t: now - rollup_days * DAY for t in ROLLUP_TABLES}
    url = engine.url.render_as_string(hide_password=True)
    for table, col in PARTITIONED.items():
        cutoff = cutoffs[table]
        if is_postgres(engine):
            dropped = 0
            with engine.connect() as c:
                parts = list_partitions(c, table)
            for name, day in parts:
                if day + DAY <= cutoff:
                    with engine.begin() as c:
                        c.execute(text(f'DROP TABLE IF EXISTS "{name}"'))
                    with _known_lock:
                        _known.discard((url, table, day))
                    dropped += 1
            out[table] = dropped
            if table in _EXPIRED_BY:  # within the day holding the cutoff
                with engine.begin() as c:
                    c.execute(text(f"DELETE FROM {table} WHERE {col} >= :d AND {col} < :c "
                                   f"AND {_EXPIRED_BY[table]} < :c"), {"d": day_of(cutoff), "c": cutoff})
        else:
            with engine.begin() as c:
                out[table] = c.execute(text(f"DELETE FROM {table} WHERE {_EXPIRED_BY.get(table, col)} < :c"),
                                       {"c": cutoff}).rowcount
    feature_cutoff = now - rollup_days * DAY
    with engine.begin() as c:
        out["gpu_minute_features"] = c.execute(text("DELETE FROM gpu_minute_features WHERE bucket < :c"),
                                               {"c": feature_cutoff}).rowcount
        out["job_hist_features"] = c.execute(text("DELETE FROM job_hist_features WHERE hour < :h"),
                                             {"h": int(feature_cutoff // 3600)}).rowcount
    horizons = {"raw": now - raw_days * DAY, "rollup": feature_cutoff}
    for table, (col, horizon, only) in ROW_PRUNED.items():
        with engine.begin() as c:
            out[table] = c.execute(text(f"DELETE FROM {table} WHERE {col} < :c{only}"),
                                   {"c": horizons[horizon]}).rowcount
    out["web_sessions"] = purge_expired(engine, now)  # a session past its expiry can never be used again
    return out
