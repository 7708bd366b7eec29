"""gpu_ledger and the serving tables readable by the Grafana role (the ledger and serving
panels, docs/grafana.md)

PostgreSQL only, like 0004 and 0010; a no-op when the role does not exist (0004 logged how to
create it).

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

ROLE = "gpufleet_grafana"
TABLES = ("gpu_ledger", "serving_minutes", "serving_deployments")


def _role_exists() -> bool:
    bind = op.get_bind()
    return bind.dialect.name == "postgresql" and bool(
        bind.execute(sa.text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": ROLE}).scalar())


def upgrade() -> None:
    if _role_exists():
        for t in TABLES:
            op.execute(f"GRANT SELECT ON {t} TO {ROLE}")


def downgrade() -> None:
    if _role_exists():
        for t in TABLES:
            op.execute(f"REVOKE ALL ON {t} FROM {ROLE}")
