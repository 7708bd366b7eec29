"""job_progress: 10 s windows of training processes' own progress (issue 14, docs/progress.md)

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_progress",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("job_pk", sa.Integer, sa.ForeignKey("jobs.id", ondelete="CASCADE",
                                                      name="fk_job_progress_job_pk_jobs"), nullable=False),
        sa.Column("node_id", sa.Integer, sa.ForeignKey("nodes.id", name="fk_job_progress_node_id_nodes")),
        sa.Column("rank", sa.Integer, nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("host", sa.String(255)),
        sa.Column("gpu", sa.String(96)),
        sa.Column("local_rank", sa.Integer),
        sa.Column("world_size", sa.Integer),
        sa.Column("start_ts", sa.Double, nullable=False),
        sa.Column("end_ts", sa.Double, nullable=False),
        sa.Column("steps", sa.Integer, nullable=False),
        sa.Column("first_step", sa.BigInteger),
        sa.Column("last_step", sa.BigInteger),
        sa.Column("max_step", sa.BigInteger),
        sa.Column("restarts", sa.Integer, nullable=False),
        sa.Column("lost_steps", sa.BigInteger, nullable=False),
        sa.Column("tokens", sa.BigInteger),
        sa.Column("samples", sa.BigInteger),
        sa.Column("productive_s", sa.Double, nullable=False),
        sa.Column("stall_s", sa.Double, nullable=False),
        sa.Column("unfinished_s", sa.Double, nullable=False),
        sa.Column("spans", sa.JSON),
        sa.Column("span_counts", sa.JSON),
        sa.Column("step_time_p50_s", sa.Double),
        sa.Column("step_time_p95_s", sa.Double),
        sa.Column("step_time_max_s", sa.Double),
        sa.Column("step_hist", sa.JSON),
        sa.Column("last_step_ts", sa.Double),
        sa.Column("since_step_s", sa.Double),
        sa.Column("open_span", sa.String(64)),
        sa.Column("open_span_s", sa.Double),
        sa.Column("alive", sa.Boolean, nullable=False),
        sa.Column("ended", sa.Boolean, nullable=False),
        sa.Column("process_start", sa.Double),
        sa.Column("flops_per_step", sa.Double),
        sa.Column("params", sa.BigInteger),
        sa.Column("dropped", sa.BigInteger, nullable=False),
        sa.Column("events", sa.JSON),
    )
    op.create_index("ix_job_progress_job_start", "job_progress", ["job_pk", "start_ts"])


def downgrade() -> None:
    op.drop_index("ix_job_progress_job_start", table_name="job_progress")
    op.drop_table("job_progress")
