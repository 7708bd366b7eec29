"""The ``job_progress`` table: one row per 10 s window of one training process's own
progress (protocol ``ProgressWindow``, docs/progress.md). Defined on the shared ``Base`` so
migrations and the schema test see it; imported at the end of ``storage/models.py``.

Rows are written inside the batch's transaction, after its idempotency key, so a retried
batch stores its windows once. None in a column = not reported (unknown, never zero).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, Double, ForeignKey, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from gpufleet.storage.models import Base


class JobProgress(Base):
    __tablename__ = "job_progress"
    __table_args__ = (Index("ix_job_progress_job_start", "job_pk", "start_ts"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_pk: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    node_id: Mapped[int | None] = mapped_column(ForeignKey("nodes.id"))
    rank: Mapped[int] = mapped_column(Integer)
    pid: Mapped[int] = mapped_column(Integer)
    host: Mapped[str | None] = mapped_column(String(255))
    gpu: Mapped[str | None] = mapped_column(String(96))
    local_rank: Mapped[int | None] = mapped_column(Integer)
    world_size: Mapped[int | None] = mapped_column(Integer)
    start_ts: Mapped[float] = mapped_column(Double)
    end_ts: Mapped[float] = mapped_column(Double)
    steps: Mapped[int] = mapped_column(Integer)
    first_step: Mapped[int | None] = mapped_column(BigInteger)
    last_step: Mapped[int | None] = mapped_column(BigInteger)
    max_step: Mapped[int | None] = mapped_column(BigInteger)
    restarts: Mapped[int] = mapped_column(Integer)
    lost_steps: Mapped[int] = mapped_column(BigInteger)
    tokens: Mapped[int | None] = mapped_column(BigInteger)
    samples: Mapped[int | None] = mapped_column(BigInteger)
    productive_s: Mapped[float] = mapped_column(Double)
    stall_s: Mapped[float] = mapped_column(Double)
    unfinished_s: Mapped[float] = mapped_column(Double)
    spans: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    span_counts: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    step_time_p50_s: Mapped[float | None] = mapped_column(Double)
    step_time_p95_s: Mapped[float | None] = mapped_column(Double)
    step_time_max_s: Mapped[float | None] = mapped_column(Double)
    step_hist: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    last_step_ts: Mapped[float | None] = mapped_column(Double)
    since_step_s: Mapped[float | None] = mapped_column(Double)
    open_span: Mapped[str | None] = mapped_column(String(64))
    open_span_s: Mapped[float | None] = mapped_column(Double)
    alive: Mapped[bool] = mapped_column(Boolean)
    ended: Mapped[bool] = mapped_column(Boolean)
    process_start: Mapped[float | None] = mapped_column(Double)
    flops_per_step: Mapped[float | None] = mapped_column(Double)
    params: Mapped[int | None] = mapped_column(BigInteger)
    dropped: Mapped[int] = mapped_column(BigInteger)
    events: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # {"events": [...], "dropped": n}
