"""alerts: lifecycle, silences, outbox (issue 7)

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "alert_groups",
        sa.Column("job_pk", sa.Integer,
                  sa.ForeignKey("jobs.id", ondelete="CASCADE", name="fk_alert_groups_job_pk_jobs"), primary_key=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("notify_seq", sa.Integer, nullable=False),
        sa.Column("first_fired_at", sa.Double, nullable=False),
        sa.Column("last_notified_at", sa.Double, nullable=False),
        sa.Column("resolved_at", sa.Double),
    )
    op.create_table(
        "alerts",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("job_pk", sa.Integer,
                  sa.ForeignKey("jobs.id", ondelete="CASCADE", name="fk_alerts_job_pk_jobs"), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("severity", sa.String(16), nullable=False),
        sa.Column("scopes", sa.JSON),
        sa.Column("wasted_gpu_hours", sa.Double, nullable=False),
        sa.Column("suppressed_by", sa.String(255)),
        sa.Column("first_seen_at", sa.Double, nullable=False),
        sa.Column("fired_at", sa.Double),
        sa.Column("last_notified_at", sa.Double),
        sa.Column("resolved_at", sa.Double),
        sa.UniqueConstraint("job_pk", "kind", name="uq_alerts_job_kind"),
    )
    op.create_index("ix_alerts_state", "alerts", ["state"])
    op.create_table(
        "alert_silences",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("job", sa.String(255)),
        sa.Column("user", sa.String(255)),
        sa.Column("kind", sa.String(32)),
        sa.Column("cluster", sa.String(128)),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("created_by", sa.String(128), nullable=False),
        sa.Column("created_at", sa.Double, nullable=False),
        sa.Column("expires_at", sa.Double, nullable=False),
    )
    op.create_index("ix_alert_silences_expires_at", "alert_silences", ["expires_at"])
    op.create_table(
        "alert_outbox",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("idempotency_key", sa.String(255), nullable=False),
        sa.Column("event", sa.String(16), nullable=False),
        sa.Column("job_pk", sa.Integer),
        sa.Column("webhook_url", sa.Text, nullable=False),
        sa.Column("payload", sa.JSON, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("created_at", sa.Double, nullable=False),
        sa.Column("next_attempt_at", sa.Double, nullable=False),
        sa.Column("claim_token", sa.String(64)),
        sa.Column("claimed_until", sa.Double),
        sa.Column("sent_at", sa.Double),
        sa.Column("last_status", sa.Integer),
        sa.Column("last_error", sa.Text),
        sa.UniqueConstraint("idempotency_key", name="uq_alert_outbox_idempotency_key"),
    )
    op.create_index("ix_alert_outbox_state_next", "alert_outbox", ["state", "next_attempt_at"])


def downgrade() -> None:
    for t in ["alert_outbox", "alert_silences", "alerts", "alert_groups"]:
        op.drop_table(t)
