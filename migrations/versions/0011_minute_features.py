"""Minute features folded at ingest (gpu_minute_features, job_hist_features), backfilled from
the raw samples already stored so existing jobs keep their analysis (docs/goodput.md).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # The state columns come from storage.minute_features' rule table (one definition for
    # the fold, its SQL merge and the table); the backfill is that module's fold.
    from gpufleet.storage.minute_features import INT_COLUMNS, NULLABLE, STATE, backfill

    op.create_table(
        "gpu_minute_features",
        sa.Column("job_pk", sa.Integer, nullable=False),
        sa.Column("bucket", sa.Double, nullable=False),
        sa.Column("gpu_pk", sa.Integer, nullable=False),
        *[sa.Column(c, sa.Integer if c in INT_COLUMNS else sa.Double, nullable=c in NULLABLE) for c in STATE],
        sa.PrimaryKeyConstraint("job_pk", "bucket", "gpu_pk", name="pk_gpu_minute_features"),
    )
    op.create_table(
        "job_hist_features",
        sa.Column("job_pk", sa.Integer, nullable=False),
        sa.Column("hour", sa.Integer, nullable=False),
        sa.Column("folds", sa.Integer, nullable=False),
        sa.Column("h", sa.LargeBinary().with_variant(postgresql.ARRAY(sa.Integer), "postgresql"), nullable=False),
        sa.PrimaryKeyConstraint("job_pk", "hour", name="pk_job_hist_features"),
    )
    backfill(op.get_bind())


def downgrade() -> None:
    op.drop_table("job_hist_features")
    op.drop_table("gpu_minute_features")
