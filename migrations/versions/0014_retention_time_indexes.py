"""Indexes leading with the time column of every table retention prunes row by row.

``storage.retention.apply_retention`` deletes, each maintenance pass (hourly), the rows of
the minute features (``bucket``, ``hour``) and of the row-pruned tables (``ROW_PRUNED``)
older than a cutoff, on both databases; on SQLite also the raw blocks (``t1``) and the
1-minute rollups (``bucket``), which PostgreSQL drops by day partition instead. No index led
with those columns (the keys lead with the job, GPU or node), so each such DELETE read the
whole table: on PostgreSQL ``EXPLAIN`` showed a Seq Scan, or (seqscan off) a full scan of an
index on (node_id, ts) / (job_pk, bucket, gpu_pk); on SQLite ``SCAN <table>``. With these the
pass reads only the expired rows. The time columns are never updated, so the minute
features' in-place (HOT) updates stay HOT (migration 0013).

PostgreSQL builds them ``CONCURRENTLY`` (outside the migration's transaction): the feature
tables are the biggest unpartitioned tables, written by every batch, and a plain CREATE INDEX
would block those writes for the whole build. ``IF NOT EXISTS`` lets a rerun after an
interrupted build go on (an interrupted concurrent build leaves an invalid index behind:
``DROP INDEX`` it and rerun).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-04
"""

from __future__ import annotations

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

# index -> (table, columns): the DELETEs apply_retention runs on both databases. The outbox's
# DELETE keeps the pending rows (state IN ('sent', 'failed')): its index leads with the state
# and then ranges over created_at within the delivered and the given-up rows.
BOTH: dict[str, tuple[str, str]] = {
    "ix_gpu_minute_features_bucket": ("gpu_minute_features", "bucket"),
    "ix_job_hist_features_hour": ("job_hist_features", "hour"),
    "ix_ingest_batches_received_at": ("ingest_batches", "received_at"),
    "ix_job_progress_end_ts": ("job_progress", "end_ts"),
    "ix_collective_windows_ts": ("collective_windows", "ts"),
    "ix_nic_samples_ts": ("nic_samples", "ts"),
    "ix_alert_outbox_state_created_at": ("alert_outbox", "state, created_at"),
    "ix_events_ts": ("events", "ts"),
}
# On SQLite only: PostgreSQL drops these tables' day partitions (an index would only cost
# every write there).
SQLITE_ONLY: dict[str, tuple[str, str]] = {
    "ix_gpu_sample_blocks_t1": ("gpu_sample_blocks", "t1"),
    "ix_gpu_samples_1m_bucket": ("gpu_samples_1m", "bucket"),
    "ix_job_samples_1m_bucket": ("job_samples_1m", "bucket"),
}


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        with op.get_context().autocommit_block():
            for name, (table, cols) in BOTH.items():
                op.execute(f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON {table} ({cols})")
        return
    for name, (table, cols) in {**BOTH, **SQLITE_ONLY}.items():
        op.create_index(name, table, cols.split(", "))


def downgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    for name, (table, _) in (BOTH if postgres else {**BOTH, **SQLITE_ONLY}).items():
        op.drop_index(name, table_name=table)
