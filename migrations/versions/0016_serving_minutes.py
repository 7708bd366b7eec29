"""Serving replicas: ``serving_minutes`` (a replica-minute of an engine's own measures, histograms
as bucket counts) and ``serving_deployments`` (each deployment's SLO labels). docs/serving.md.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "serving_minutes",
        sa.Column("cluster", sa.String(64), nullable=False),
        sa.Column("deployment", sa.String(253), nullable=False),
        sa.Column("replica", sa.String(253), nullable=False),
        sa.Column("minute", sa.BigInteger, nullable=False),  # epoch seconds: past 2038 a 32-bit integer is too small
        sa.Column("engine", sa.String(16), nullable=False),
        sa.Column("node", sa.String(255), nullable=True),
        sa.Column("job_id", sa.String(255), nullable=True),
        sa.Column("gpus", sa.Integer, nullable=False),
        sa.Column("gpu_uuids", sa.JSON, nullable=True),
        sa.Column("measures", sa.JSON, nullable=False),
        sa.PrimaryKeyConstraint("cluster", "deployment", "replica", "minute", name="pk_serving_minutes"),
    )
    op.create_index("ix_serving_minutes_minute", "serving_minutes", ["minute"])
    op.create_table(
        "serving_deployments",
        sa.Column("cluster", sa.String(64), nullable=False),
        sa.Column("name", sa.String(253), nullable=False),
        sa.Column("labels", sa.JSON, nullable=False),
        sa.Column("updated_ts", sa.Double, nullable=False),
        sa.PrimaryKeyConstraint("cluster", "name", name="pk_serving_deployments"),
    )


def downgrade() -> None:
    op.drop_table("serving_deployments")
    op.drop_index("ix_serving_minutes_minute", table_name="serving_minutes")
    op.drop_table("serving_minutes")
