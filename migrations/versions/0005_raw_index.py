"""raw samples: drop the (gpu_pk, ts) b-tree index

Nothing reads raw samples by GPU: the API, the web UI and the Grafana dashboards read the
1-minute rollups (indexed by (gpu_pk, bucket)), and the goodput analysis reads a job's raw
rows through (job_pk, ts). The index still cost every inserted row a b-tree insertion:
measured with binary COPY into gpu_samples on this project's 2-core box, 4.9 us per row with
it, 3.8 us without (docs/benchmarks.md). A per-GPU drill-down into raw data goes through the
GPU's job (allocations) and (job_pk, ts), or through the BRIN index on ts for short windows.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # On PostgreSQL this is the partitioned parent's index: dropping it drops each partition's.
    op.drop_index("ix_gpu_samples_gpu_ts", table_name="gpu_samples")


def downgrade() -> None:
    op.create_index("ix_gpu_samples_gpu_ts", "gpu_samples", ["gpu_pk", "ts"])
