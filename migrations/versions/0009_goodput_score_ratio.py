"""goodput score: a ratio 0..1 like every other ratio of the API (it was 0..100)

Reports written before (report version 1) hold the score in percent; they are rescaled here,
so ended jobs that are never re-analyzed show the same 0-100% as new ones. The report JSON's
own ``goodput_score`` is left as it was (version 1 says how to read it); the API and
Grafana read the column.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

from __future__ import annotations

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def _version_1() -> str:
    if op.get_bind().dialect.name == "postgresql":
        return "(report::jsonb ->> 'version') = '1'"
    return "json_extract(report, '$.version') = 1"


def upgrade() -> None:
    op.execute(f"UPDATE job_reports SET goodput_score = goodput_score / 100.0 "
               f"WHERE goodput_score IS NOT NULL AND {_version_1()}")


def downgrade() -> None:
    # After the upgrade every score is a ratio; the old code reads them all as 0..100.
    op.execute("UPDATE job_reports SET goodput_score = goodput_score * 100.0 WHERE goodput_score IS NOT NULL")
