"""raw samples as compressed blocks: gpu_samples (a row per GPU-second) -> gpu_sample_blocks

One row per (GPU, job, 10-minute window) of each write, the samples as one compressed block
(storage/sample_codec.py, docs/collector.md for the layouts measured). The upgrade converts
every stored sample (day by day, GPU by GPU, nothing dropped) and then drops the wide table;
the downgrade decodes the blocks back into wide rows.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01
"""

from __future__ import annotations

from typing import Any

import numpy as np
import sqlalchemy as sa
from alembic import op

from gpufleet.storage import retention
from gpufleet.storage.fields import FIELD_INDEX, FIELDS, NAMES, NF
from gpufleet.storage.raw_samples import block_rows, write_block_rows

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

DAY = 86400
_CHUNK = 200_000  # rows per fetch while converting: bounded memory for any table size


def _pg() -> bool:
    return op.get_bind().dialect.name == "postgresql"


def _days(table: str, col: str) -> list[int]:
    bind = op.get_bind()
    lo, hi = bind.execute(sa.text(f"SELECT min({col}), max({col}) FROM {table}")).one()
    if lo is None:
        return []
    return list(range(retention.day_of(lo), retention.day_of(hi) + 1, DAY))


def _create_blocks() -> None:
    op.create_table(
        "gpu_sample_blocks",
        sa.Column("gpu_pk", sa.Integer, nullable=False),
        sa.Column("job_pk", sa.Integer),
        sa.Column("t0", sa.Double, nullable=False),
        sa.Column("t1", sa.Double, nullable=False),
        sa.Column("n", sa.Integer, nullable=False),
        sa.Column("data", sa.LargeBinary, nullable=False),
        postgresql_partition_by="RANGE (t0)",
    )
    op.create_index("ix_gpu_sample_blocks_gpu_t0", "gpu_sample_blocks", ["gpu_pk", "t0"])
    op.create_index("ix_gpu_sample_blocks_job_t0", "gpu_sample_blocks", ["job_pk", "t0"])


def upgrade() -> None:
    bind = op.get_bind()
    _create_blocks()
    cols = [c["name"] for c in sa.inspect(bind).get_columns("gpu_samples")]
    fields = [f for f in NAMES if f in cols]  # a column the catalog no longer has is not kept
    rows_of = [FIELD_INDEX[f] for f in fields]
    days = _days("gpu_samples", "ts")
    if _pg():
        for d in days:
            op.execute(retention.create_partition_sql("gpu_sample_blocks", d))
    select = f"SELECT ts, gpu_pk, job_pk, {', '.join(fields)} FROM gpu_samples WHERE ts >= :lo AND ts < :hi " \
             "ORDER BY gpu_pk, ts"
    for d in days:
        # stream_results on the statement only (on the connection it would stay set for the DDL after)
        res = bind.execute(sa.text(select).execution_options(stream_results=True), {"lo": d, "hi": d + DAY})
        while chunk := res.fetchmany(_CHUNK):
            # None -> NaN in numpy's own conversion (no Python loop per value)
            a = np.array(chunk, dtype=np.float64)
            vals = np.full((NF, len(a)), np.nan)
            vals[rows_of] = a[:, 3:].T
            job = np.where(np.isnan(a[:, 2]), -1, a[:, 2]).astype(np.int64)
            write_block_rows(bind, block_rows(a[:, 0], a[:, 1].astype(np.int64), job, vals))
        res.close()
    op.drop_table("gpu_samples")


def _wide_type(dtype: str) -> Any:
    if dtype == "f4":
        return sa.Float(precision=24).with_variant(sa.Float(), "sqlite")
    return sa.Double() if dtype == "f8" else sa.BigInteger()


def downgrade() -> None:
    from gpufleet.storage.copy_encoding import insert_wide_rows
    from gpufleet.storage.sample_codec import decode_blocks

    bind = op.get_bind()
    op.create_table(
        "gpu_samples",
        sa.Column("ts", sa.Double, nullable=False),
        sa.Column("gpu_pk", sa.Integer, nullable=False),
        sa.Column("job_pk", sa.Integer),
        *[sa.Column(f.name, _wide_type(f.dtype)) for f in FIELDS],
        postgresql_partition_by="RANGE (ts)",
    )
    op.create_index("ix_gpu_samples_job_ts", "gpu_samples", ["job_pk", "ts"])
    if _pg():
        op.execute("CREATE INDEX ix_gpu_samples_ts_brin ON gpu_samples USING brin (ts)")
    days = _days("gpu_sample_blocks", "t0")
    for d in days:
        if _pg():
            op.execute(retention.create_partition_sql("gpu_samples", d))
        q = sa.text("SELECT gpu_pk, job_pk, data FROM gpu_sample_blocks WHERE t0 >= :lo AND t0 < :hi")
        blocks = bind.execute(q, {"lo": d, "hi": d + DAY}).all()
        if not blocks:
            continue
        ts, vals, counts = decode_blocks([bytes(b[2]) for b in blocks])
        gpu = np.repeat([b[0] for b in blocks], counts).astype(np.int64)
        job = np.repeat([-1 if b[1] is None else b[1] for b in blocks], counts).astype(np.int64)
        insert_wide_rows(bind, ts, gpu, job, vals)
    op.drop_table("gpu_sample_blocks")
