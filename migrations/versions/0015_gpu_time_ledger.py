"""GPU-time ledger: the ``gpu_ledger`` table (job, minute, category -> GPU-seconds), and the
ledger of every job analysed before (docs/goodput.md, "The ledger", "History").

History, in two ways:

* Jobs whose minute features are all still stored (their first feature hour is not after the
  job's start hour: retention has not pruned them) are marked due (``analyzed_until = -1``): the
  next analysis pass recomputes their report and ledger from the same features, exactly as for
  a new job. The recomputation is the analysis's, not this migration's: the migration cannot
  import the analysis (a migration sees only the schema) and would hold the upgrade for as long
  as a full re-analysis takes.
* Jobs whose features retention already pruned keep their report; their ledger is written here
  from it: each flag kind's waste (scaled so the kinds add up to the report's total),
  productive = the old score x the allocation (at most what the waste leaves), the rest
  unobserved; spread evenly over the job's minutes. An approximation, marked by the report's
  version (2): the old numbers, made to add up, not recomputed.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-07
"""

from __future__ import annotations

import json
import math
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

HOUR = 3600


def upgrade() -> None:
    op.create_table(
        "gpu_ledger",
        sa.Column("job_pk", sa.Integer, sa.ForeignKey("jobs.id", ondelete="CASCADE",
                                                      name="fk_gpu_ledger_job_pk_jobs"), nullable=False),
        sa.Column("minute", sa.Integer, nullable=False),
        sa.Column("category", sa.String(32), nullable=False),
        sa.Column("gpu_s", sa.Double, nullable=False),
        sa.PrimaryKeyConstraint("job_pk", "minute", "category", name="pk_gpu_ledger"),
    )
    op.create_index("ix_gpu_ledger_minute", "gpu_ledger", ["minute"])
    bind = op.get_bind()
    kept = ("EXISTS (SELECT 1 FROM job_hist_features h WHERE h.job_pk = job_reports.job_pk) AND "
            "(SELECT min(h.hour) FROM job_hist_features h WHERE h.job_pk = job_reports.job_pk) * 3600 <= "
            "coalesce((SELECT j.start_ts FROM jobs j WHERE j.id = job_reports.job_pk), 0) + 3600")
    op.execute(f"UPDATE job_reports SET analyzed_until = -1 WHERE {kept}")
    rows = bind.execute(sa.text(f"SELECT job_pk, report, goodput_score, allocated_gpu_hours, wasted_gpu_hours "
                                f"FROM job_reports WHERE NOT ({kept})")).all()
    table = sa.table("gpu_ledger", sa.column("job_pk"), sa.column("minute"), sa.column("category"),
                     sa.column("gpu_s"))
    for job_pk, report, score, allocated, wasted in rows:
        out = _from_report(int(job_pk), report if isinstance(report, dict) else json.loads(report or "{}"),
                           score, float(allocated or 0.0), float(wasted or 0.0))
        for i in range(0, len(out), 5000):
            bind.execute(table.insert(), out[i:i + 5000])


def _from_report(job_pk: int, report: dict[str, Any], score: float | None, allocated: float,
                 wasted: float) -> list[dict[str, Any]]:
    win = report.get("window") or {}
    start, end = win.get("start"), win.get("end")
    if start is None or end is None or end <= start or allocated <= 0:
        return []
    b0, b1 = math.floor(start / 60), math.ceil(end / 60)
    by_kind = {k: float(v) for k, v in (report.get("wasted_gpu_hours") or {}).items() if v and float(v) > 0}
    wasted = min(wasted, allocated)
    s = sum(by_kind.values())
    cats = {k: v * wasted / s for k, v in by_kind.items()} if s > 0 else {}
    if wasted > 0 and not cats:
        cats["unexplained"] = wasted
    productive = min(allocated - wasted, (score or 0.0) * allocated)
    cats["productive"] = productive
    cats["unobserved"] = allocated - wasted - productive
    edges = [(max(start, m * 60.0), min(end, (m + 1) * 60.0)) for m in range(b0, b1)]
    span = end - start
    out = []
    for (a, b), m in zip(edges, range(b0, b1), strict=True):
        share = max(0.0, b - a) / span
        for k, v in cats.items():
            secs = round(v * HOUR * share, 3)
            if secs > 0:
                out.append({"job_pk": job_pk, "minute": m, "category": k, "gpu_s": secs})
    return out


def downgrade() -> None:
    op.drop_index("ix_gpu_ledger_minute", table_name="gpu_ledger")
    op.drop_table("gpu_ledger")
