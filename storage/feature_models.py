"""Tables of the minute features folded at ingest (storage.minute_features): one mergeable
state per (job, minute, GPU) and one histogram row per (job, hour)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Column, Double, Integer, LargeBinary, PrimaryKeyConstraint, Table
from sqlalchemy.dialects.postgresql import ARRAY

from gpufleet.storage.minute_features import FEATURE_TABLE, HIST_TABLE, INT_COLUMNS, NULLABLE, STATE
from gpufleet.storage.models import Base


def _state_columns() -> list[Column[Any]]:
    return [Column(c, Integer if c in INT_COLUMNS else Double, nullable=c in NULLABLE) for c in STATE]


gpu_minute_features = Table(
    FEATURE_TABLE,
    Base.metadata,
    Column("job_pk", Integer, nullable=False),
    Column("bucket", Double, nullable=False),  # epoch seconds at the minute's start
    Column("gpu_pk", Integer, nullable=False),
    *_state_columns(),
    # (job, minute, GPU): the analysis reads a job's minutes in ranges; writers lock in this order.
    PrimaryKeyConstraint("job_pk", "bucket", "gpu_pk", name="pk_gpu_minute_features"),
)

job_hist_features = Table(
    HIST_TABLE,
    Base.metadata,
    Column("job_pk", Integer, nullable=False),
    Column("hour", Integer, nullable=False),  # floor(ts / 3600)
    Column("folds", Integer, nullable=False),  # batches folded in: changes whenever the hour does
    # 4 fields x 100 bins of counts: int4[] on PostgreSQL, little-endian int32 bytes on SQLite
    Column("h", LargeBinary().with_variant(ARRAY(Integer), "postgresql"), nullable=False),
    PrimaryKeyConstraint("job_pk", "hour", name="pk_job_hist_features"),
)
