"""collector scale: 1-minute rollups per GPU and per job (issue 4 extends: partitions, retention)

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


def upgrade() -> None:
    op.create_table(
        "gpu_samples_1m",
        sa.Column("bucket", sa.Double, nullable=False),
        sa.Column("gpu_pk", sa.Integer, nullable=False),
        sa.Column("job_pk", sa.Integer),
        sa.Column("n", sa.Integer, nullable=False),
        *[sa.Column(name, _type(dtype)) for name, dtype in ROLLUP_FIELDS],
        sa.UniqueConstraint("gpu_pk", "bucket", name="uq_gpu_samples_1m_gpu_bucket"),
    )
    op.create_index("ix_gpu_samples_1m_job_bucket", "gpu_samples_1m", ["job_pk", "bucket"])
    op.create_table(
        "job_samples_1m",
        sa.Column("bucket", sa.Double, nullable=False),
        sa.Column("job_pk", sa.Integer, nullable=False),
        sa.Column("n", sa.Integer, nullable=False),
        *[sa.Column(name, _type(dtype)) for name, dtype in ROLLUP_FIELDS],
        sa.UniqueConstraint("job_pk", "bucket", name="uq_job_samples_1m_job_bucket"),
    )


def downgrade() -> None:
    op.drop_table("job_samples_1m")
    op.drop_table("gpu_samples_1m")
