"""SQLAlchemy 2 models. Tables are created by Alembic migrations, never ``create_all``.

Times are unix epoch seconds (DOUBLE PRECISION): cheap to COPY, the same on SQLite and
PostgreSQL, and Grafana's ``$__unixEpochFilter`` macros read them directly.
Raw samples are compressed blocks (``gpu_sample_blocks``); the 1-minute rollups get one
column per catalog field."""

from __future__ import annotations

from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    Double,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from gpufleet.catalog import CATALOG, Field

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {dict[str, Any]: JSON}
    # Every model here is mapped to one Table; SQLAlchemy types ``__table__`` as the wider
    # FromClause, which has no insert()/update(). Narrowed for the type checker only.
    __table__: ClassVar[Table]


def column_type(f: Field) -> Any:
    if f.dtype == "f4":
        return Float(precision=24).with_variant(Float(), "sqlite")
    if f.dtype == "f8":
        return Double()
    return BigInteger()


def sample_columns() -> list[Column[Any]]:
    return [Column(f.name, column_type(f), nullable=True) for f in CATALOG.fields]


class Cluster(Base):
    __tablename__ = "clusters"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)


class Node(Base):
    __tablename__ = "nodes"
    __table_args__ = (UniqueConstraint("cluster_id", "name", name="uq_nodes_cluster_name"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    cluster_id: Mapped[int] = mapped_column(ForeignKey("clusters.id"))
    name: Mapped[str] = mapped_column(String(255))
    agent_version: Mapped[str | None] = mapped_column(String(64))
    last_seen: Mapped[float | None] = mapped_column(Double)
    labels: Mapped[dict[str, Any] | None] = mapped_column(JSON)


class Gpu(Base):
    __tablename__ = "gpus"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id"), index=True)
    uuid: Mapped[str] = mapped_column(String(96), unique=True)
    index: Mapped[int] = mapped_column(Integer)
    model: Mapped[str | None] = mapped_column(String(128))
    mig_profile: Mapped[str | None] = mapped_column(String(64))
    parent_uuid: Mapped[str | None] = mapped_column(String(96))
    memory_total_bytes: Mapped[float | None] = mapped_column(Double)
    last_seen: Mapped[float | None] = mapped_column(Double)


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (UniqueConstraint("cluster_id", "job_id", name="uq_jobs_cluster_job"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    cluster_id: Mapped[int] = mapped_column(ForeignKey("clusters.id"))
    job_id: Mapped[str] = mapped_column(String(255))
    source: Mapped[str] = mapped_column(String(32), default="slurm")
    user: Mapped[str | None] = mapped_column(String(255), index=True)
    name: Mapped[str | None] = mapped_column(String(512))
    account: Mapped[str | None] = mapped_column(String(255))
    partition: Mapped[str | None] = mapped_column(String(255))
    namespace: Mapped[str | None] = mapped_column(String(255))
    num_nodes: Mapped[int | None] = mapped_column(Integer)
    ntasks: Mapped[int | None] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16), default="running")  # running | ended
    start_ts: Mapped[float | None] = mapped_column(Double, index=True)
    end_ts: Mapped[float | None] = mapped_column(Double)
    last_sample_ts: Mapped[float | None] = mapped_column(Double)
    labels: Mapped[dict[str, Any] | None] = mapped_column(JSON)


class Allocation(Base):
    """Which GPU belonged to which job, over which time range (end NULL = still running)."""

    __tablename__ = "allocations"
    __table_args__ = (
        Index("ix_allocations_job_start", "job_pk", "start_ts"),
        Index("ix_allocations_gpu_start", "gpu_pk", "start_ts"),
        # one open allocation per GPU (migration 0002); the write path relies on it
        Index("uq_allocations_open_gpu", "gpu_pk", unique=True,
              postgresql_where=text("end_ts IS NULL"), sqlite_where=text("end_ts IS NULL")),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_pk: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    gpu_pk: Mapped[int] = mapped_column(ForeignKey("gpus.id"))
    start_ts: Mapped[float] = mapped_column(Double)
    end_ts: Mapped[float | None] = mapped_column(Double)


# Raw samples: one row per (GPU, job, 10-minute window) of each write, the window's samples
# as one compressed block (storage/sample_codec.py; written by storage/raw_samples.py, read
# only through storage/raw_read.py). Blocks never cross a window, so t0 >= window start and
# t1 < window end bound every lookup by (gpu_pk, t0) or (job_pk, t0).
gpu_sample_blocks = Table(
    "gpu_sample_blocks",
    Base.metadata,
    Column("gpu_pk", Integer, nullable=False),
    Column("job_pk", Integer, nullable=True),
    Column("t0", Double, nullable=False),
    Column("t1", Double, nullable=False),
    Column("n", Integer, nullable=False),
    Column("data", LargeBinary, nullable=False),
    Index("ix_gpu_sample_blocks_gpu_t0", "gpu_pk", "t0"),
    Index("ix_gpu_sample_blocks_job_t0", "job_pk", "t0"),
    # PostgreSQL: daily range partitions on t0 (storage/retention.py creates them ahead and
    # drops them for retention); SQLite ignores this.
    postgresql_partition_by="RANGE (t0)",
)


class Event(Base):
    __tablename__ = "events"
    __table_args__ = (Index("ix_events_node_ts", "node_id", "ts"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    ts: Mapped[float] = mapped_column(Double)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id"))
    gpu_pk: Mapped[int | None] = mapped_column(ForeignKey("gpus.id"))
    kind: Mapped[str] = mapped_column(String(32))
    code: Mapped[int | None] = mapped_column(Integer)
    message: Mapped[str] = mapped_column(Text, default="")


class Flag(Base):
    """A goodput finding on a job. One row per (job, kind, scope); it opens and resolves."""

    __tablename__ = "flags"
    __table_args__ = (
        UniqueConstraint("job_pk", "kind", "scope", name="uq_flags_job_kind_scope"),
        Index("ix_flags_open", "open"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_pk: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(32))
    scope: Mapped[str] = mapped_column(String(255), default="")  # "" = whole job; else node/gpu
    severity: Mapped[str] = mapped_column(String(16))
    start_ts: Mapped[float] = mapped_column(Double)
    end_ts: Mapped[float] = mapped_column(Double)
    wasted_gpu_hours: Mapped[float] = mapped_column(Double, default=0.0)
    evidence: Mapped[dict[str, Any]] = mapped_column(JSON)
    suggestion: Mapped[str] = mapped_column(Text)
    open: Mapped[bool] = mapped_column(Boolean, default=True)
    opened_at: Mapped[float] = mapped_column(Double)
    resolved_at: Mapped[float | None] = mapped_column(Double)


class JobReport(Base):
    """The latest efficiency report per job (the analysis output the API serves)."""

    __tablename__ = "job_reports"
    job_pk: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    computed_at: Mapped[float] = mapped_column(Double)
    analyzed_until: Mapped[float] = mapped_column(Double)
    goodput_score: Mapped[float | None] = mapped_column(Float)
    allocated_gpu_hours: Mapped[float] = mapped_column(Double, default=0.0)
    wasted_gpu_hours: Mapped[float] = mapped_column(Double, default=0.0)
    report: Mapped[dict[str, Any]] = mapped_column(JSON)


class IngestBatch(Base):
    """Idempotency ledger: a (boot id, seq) seen once is acknowledged again, not stored again."""

    __tablename__ = "ingest_batches"
    boot_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id"))
    received_at: Mapped[float] = mapped_column(Double)
    rows: Mapped[int] = mapped_column(Integer)


class ApiToken(Base):
    """Bearer tokens, stored as SHA-256 hashes. role: agent | viewer | operator | admin.
    An agent token may be scoped to a cluster and optionally a node."""

    __tablename__ = "api_tokens"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    role: Mapped[str] = mapped_column(String(16))
    cluster: Mapped[str | None] = mapped_column(String(128))
    node: Mapped[str | None] = mapped_column(String(255))
    created_at: Mapped[float] = mapped_column(Double)
    revoked_at: Mapped[float | None] = mapped_column(Double)


def _rollup_columns() -> list[Column[Any]]:
    # One column per catalog field holding the catalog's aggregate (mean/max/last) over the
    # bucket, so a 1-minute series reads like the raw table.
    return [Column(f.name, Double if f.dtype == "f8" else column_type(f), nullable=True) for f in CATALOG.fields]


gpu_samples_1m = Table(
    "gpu_samples_1m",
    Base.metadata,
    Column("bucket", Double, nullable=False),  # epoch seconds at the minute's start
    Column("gpu_pk", Integer, nullable=False),
    Column("job_pk", Integer, nullable=True),
    Column("n", Integer, nullable=False),  # raw samples folded in
    Column("last_ts", Double, nullable=False),  # newest raw ts folded in (decides `last` fields)
    *_rollup_columns(),
    UniqueConstraint("gpu_pk", "bucket", name="uq_gpu_samples_1m_gpu_bucket"),
    Index("ix_gpu_samples_1m_job_bucket", "job_pk", "bucket"),
    postgresql_partition_by="RANGE (bucket)",
)

job_samples_1m = Table(
    "job_samples_1m",
    Base.metadata,
    Column("bucket", Double, nullable=False),
    Column("job_pk", Integer, nullable=False),
    Column("n", Integer, nullable=False),  # GPU-samples folded in (GPUs x seconds)
    Column("last_ts", Double, nullable=False),
    *_rollup_columns(),
    UniqueConstraint("job_pk", "bucket", name="uq_job_samples_1m_job_bucket"),
    postgresql_partition_by="RANGE (bucket)",
)


# Tables owned by other parts, on the same metadata (imported last: they need Base).
from gpufleet.storage import (  # noqa: E402
    alert_models,  # noqa: F401
    collectives_models,  # noqa: F401
    feature_models,  # noqa: F401
    gpu_ledger,  # noqa: F401
    progress_models,  # noqa: F401
    serving_models,  # noqa: F401
    session_models,  # noqa: F401
)
