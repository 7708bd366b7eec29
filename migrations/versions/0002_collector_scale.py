"""collector scale: 1-minute rollups per GPU and per job, partitioned by day on PostgreSQL; BRIN and partial indexes

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

# Frozen at this revision (see 0001): field name, dtype.
ROLLUP_FIELDS = [
    ("gr_engine_active", "f4"),
    ("sm_active", "f4"),
    ("sm_occupancy", "f4"),
    ("tensor_active", "f4"),
    ("dram_active", "f4"),
    ("fp64_active", "f4"),
    ("fp32_active", "f4"),
    ("fp16_active", "f4"),
    ("gpu_util", "f4"),
    ("mem_copy_util", "f4"),
    ("fb_used_bytes", "f8"),
    ("fb_total_bytes", "f8"),
    ("power_w", "f4"),
    ("energy_j", "f8"),
    ("temp_c", "f4"),
    ("sm_clock_mhz", "f4"),
    ("mem_clock_mhz", "f4"),
    ("clock_event_reasons", "i8"),
    ("pcie_tx_bytes_s", "f4"),
    ("pcie_rx_bytes_s", "f4"),
    ("nvlink_tx_bytes_s", "f4"),
    ("nvlink_rx_bytes_s", "f4"),
    ("ib_tx_bytes_s", "f4"),
    ("ib_rx_bytes_s", "f4"),
    ("xid_last", "i8"),
    ("ecc_dbe_volatile", "i8"),
    ("ecc_sbe_volatile", "i8"),
    ("row_remap_failure", "i8"),
    ("nvlink_error_count", "i8"),
    ("pcie_replay_count", "i8"),]


def _type(dtype: str) -> sa.types.TypeEngine:
    if dtype == "f4":
        return sa.Float(precision=24).with_variant(sa.Float(), "sqlite")
    if dtype == "f8":
        return sa.Double()
    return sa.BigInteger()


def _rollup_type(dtype: str) -> sa.types.TypeEngine:
    # Rollups of 8-byte fields stay 8-byte; the rest keep the raw column's type.
    return sa.Double() if dtype == "f8" else _type(dtype)


def upgrade() -> None:
    op.create_table(
        "gpu_samples_1m",
        sa.Column("bucket", sa.Double, nullable=False),
        sa.Column("gpu_pk", sa.Integer, nullable=False),
        sa.Column("job_pk", sa.Integer),
        sa.Column("n", sa.Integer, nullable=False),
        sa.Column("last_ts", sa.Double, nullable=False),
        *[sa.Column(name, _rollup_type(dtype)) for name, dtype in ROLLUP_FIELDS],
        sa.UniqueConstraint("gpu_pk", "bucket", name="uq_gpu_samples_1m_gpu_bucket"),
        postgresql_partition_by="RANGE (bucket)",
    )
    op.create_index("ix_gpu_samples_1m_job_bucket", "gpu_samples_1m", ["job_pk", "bucket"])
    op.create_table(
        "job_samples_1m",
        sa.Column("bucket", sa.Double, nullable=False),
        sa.Column("job_pk", sa.Integer, nullable=False),
        sa.Column("n", sa.Integer, nullable=False),
        sa.Column("last_ts", sa.Double, nullable=False),
        *[sa.Column(name, _rollup_type(dtype)) for name, dtype in ROLLUP_FIELDS],
        sa.UniqueConstraint("job_pk", "bucket", name="uq_job_samples_1m_job_bucket"),
        postgresql_partition_by="RANGE (bucket)",
    )
    # At most one open allocation per GPU (samples carry one job per GPU at a time): two
    # collector processes racing to open the same one cannot both succeed. Partial indexes
    # work on both databases; it also serves the open-allocation lookup on every write.
    op.create_index("uq_allocations_open_gpu", "allocations", ["gpu_pk"], unique=True,
                    postgresql_where=sa.text("end_ts IS NULL"), sqlite_where=sa.text("end_ts IS NULL"))
    if op.get_bind().dialect.name == "postgresql":
        # Time-range scans over the whole fleet (retention checks, Grafana's fleet panels):
        # BRIN is tiny because rows arrive roughly in ts order; per-GPU and per-job scans use
        # the b-trees above.
        op.execute("CREATE INDEX ix_gpu_samples_ts_brin ON gpu_samples USING brin (ts)")
        # The stale-job sweep reads running jobs only.
        op.execute("CREATE INDEX ix_jobs_running ON jobs (last_sample_ts) WHERE state = 'running'")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP INDEX IF EXISTS ix_jobs_running")
        op.execute("DROP INDEX IF EXISTS ix_gpu_samples_ts_brin")
    op.drop_index("uq_allocations_open_gpu", table_name="allocations")
    op.drop_table("job_samples_1m")
    op.drop_table("gpu_samples_1m")
