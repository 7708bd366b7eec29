"""web_sessions: server-side browser sessions for sign-in with a token (issue 18, docs/api.md)

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "web_sessions",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("session_hash", sa.String(64), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("cluster", sa.String(128)),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("token_id", sa.Integer, sa.ForeignKey("api_tokens.id", ondelete="CASCADE",
                                                        name="fk_web_sessions_token_id_api_tokens")),
        sa.Column("created_at", sa.Double, nullable=False),
        sa.Column("expires_at", sa.Double, nullable=False),
        sa.UniqueConstraint("session_hash", name="uq_web_sessions_session_hash"),
    )
    op.create_index("ix_web_sessions_expires_at", "web_sessions", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_web_sessions_expires_at", table_name="web_sessions")
    op.drop_table("web_sessions")
