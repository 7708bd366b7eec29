"""job_progress readable by the Grafana role (the goodput dashboard, docs/progress.md)

PostgreSQL only, like 0004; a no-op when the role does not exist (0004 logged how to create it).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

ROLE = "gpufleet_grafana"


def _role_exists() -> bool:
    bind = op.get_bind()
    return bind.dialect.name == "postgresql" and bool(
        bind.execute(sa.text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": ROLE}).scalar())


def upgrade() -> None:
    if _role_exists():
        op.execute(f"GRANT SELECT ON job_progress TO {ROLE}")


def downgrade() -> None:
    if _role_exists():
        op.execute(f"REVOKE ALL ON job_progress FROM {ROLE}")
