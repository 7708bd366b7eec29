"""Free space in the minute-feature tables' pages (PostgreSQL ``fillfactor``), so the upserts
that fold every batch into its GPU-minute and job-hour rows are HOT updates.

Each 10-second batch rewrites the GPU-minute state it folds into (about six times a minute).
In full pages every rewrite was a new tuple on another page: a new primary-key entry, more
WAL and more to vacuum (3% of the updates were HOT in ``bench/ingest/write_path_micro.py``).
No updated column is indexed (the key is the primary key and never changes), so with room
on the page PostgreSQL updates in place. The partitioned 1-minute rollups get the same from
``storage.retention.create_partition_sql`` (fillfactor 70 on every partition it creates).
Existing pages keep their fill until rewritten; new rows land in pages with the free space.
SQLite has no such setting: a no-op there.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01
"""

from __future__ import annotations

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

# table -> fillfactor: a GPU-minute state row is ~400 bytes and folded ~6 times; the job-hour
# histogram row (1.6 kB) is folded by every batch of the job in that hour.
FILLFACTOR = {"gpu_minute_features": 70, "job_hist_features": 50}


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, ff in FILLFACTOR.items():
        op.execute(f"ALTER TABLE {table} SET (fillfactor = {ff})")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table in FILLFACTOR:
        op.execute(f"ALTER TABLE {table} RESET (fillfactor)")
