"""collective_windows, nic_samples, gpu_nics: NCCL collectives and the network fabric (issue 15,
docs/nccl.md)

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "collective_windows",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("job_pk", sa.Integer, sa.ForeignKey("jobs.id", ondelete="CASCADE",
                                                      name="fk_collective_windows_job_pk_jobs")),
        sa.Column("node_id", sa.Integer, sa.ForeignKey("nodes.id", name="fk_collective_windows_node_id_nodes"),
                  nullable=False),
        sa.Column("gpu_pk", sa.Integer, sa.ForeignKey("gpus.id", name="fk_collective_windows_gpu_pk_gpus")),
        sa.Column("ts", sa.Double, nullable=False),
        sa.Column("window_s", sa.Double, nullable=False),
        sa.Column("comm", sa.String(64), nullable=False),
        sa.Column("rank", sa.Integer, nullable=False),
        sa.Column("n_ranks", sa.Integer),
        sa.Column("n_nodes", sa.Integer),
        sa.Column("coll", sa.String(64), nullable=False),
        sa.Column("size_bucket", sa.BigInteger, nullable=False),
        sa.Column("count", sa.Integer, nullable=False),
        sa.Column("bytes", sa.Double, nullable=False),
        sa.Column("exec_us_p50", sa.Double, nullable=False),
        sa.Column("exec_us_p95", sa.Double, nullable=False),
        sa.Column("exec_us_max", sa.Double, nullable=False),
        sa.Column("busbw_gbs_p50", sa.Double),
        sa.Column("pid", sa.Integer),
        sa.Column("timing_source", sa.String(32)),
    )
    op.create_index("ix_collective_windows_job_ts", "collective_windows", ["job_pk", "ts"])
    op.create_index("ix_collective_windows_node_ts", "collective_windows", ["node_id", "ts"])
    op.create_table(
        "nic_samples",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("node_id", sa.Integer, sa.ForeignKey("nodes.id", name="fk_nic_samples_node_id_nodes"),
                  nullable=False),
        sa.Column("ts", sa.Double, nullable=False),
        sa.Column("nic", sa.String(64), nullable=False),
        sa.Column("interval_s", sa.Double, nullable=False),
        sa.Column("link_layer", sa.String(32)),
        sa.Column("state", sa.String(32)),
        sa.Column("rate_gbps", sa.Double),
        sa.Column("tx_bytes_s", sa.Double),
        sa.Column("rx_bytes_s", sa.Double),
        sa.Column("xmit_wait", sa.Double),
        sa.Column("errors", sa.Double),
        sa.Column("counters", sa.JSON),
    )
    op.create_index("ix_nic_samples_node_ts", "nic_samples", ["node_id", "ts"])
    op.create_table(
        "gpu_nics",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("gpu_pk", sa.Integer, sa.ForeignKey("gpus.id", ondelete="CASCADE", name="fk_gpu_nics_gpu_pk_gpus"),
                  nullable=False),
        sa.Column("node_id", sa.Integer, sa.ForeignKey("nodes.id", name="fk_gpu_nics_node_id_nodes"), nullable=False),
        sa.Column("nic", sa.String(64), nullable=False),
        sa.Column("mode", sa.String(16), nullable=False),
        sa.Column("seen_ts", sa.Double, nullable=False),
        sa.UniqueConstraint("gpu_pk", "nic", name="uq_gpu_nics_gpu_nic"),
    )


def downgrade() -> None:
    op.drop_table("gpu_nics")
    op.drop_index("ix_nic_samples_node_ts", table_name="nic_samples")
    op.drop_table("nic_samples")
    op.drop_index("ix_collective_windows_node_ts", table_name="collective_windows")
    op.drop_index("ix_collective_windows_job_ts", table_name="collective_windows")
    op.drop_table("collective_windows")
