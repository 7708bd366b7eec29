"""initial schema: clusters, nodes, gpus, jobs, allocations, wide samples, events, flags

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

# Frozen copy of the catalog's fields at this revision: a migration must not change when
# the catalog does. New catalog fields get their own revision (tests/test_schema.py checks).
SAMPLE_FIELDS = [
    ("gr_engine_active", "f4"),
    ("sm_active", "f4"),
    ("sm_occupancy", "f4"),
    ("tensor_active", "f4"),
    ("dram_active", "f4"),
    ("fp64_active", "f4"),
    ("fp32_active", "f4"),
    ("fp16_active", "f4"),
    ("gpu_util", "f4"),
    ("mem_copy_util", "f4"),
    ("fb_used_bytes", "f8"),
    ("fb_total_bytes", "f8"),
    ("power_w", "f4"),
    ("energy_j", "f8"),
    ("temp_c", "f4"),
    ("sm_clock_mhz", "f4"),
    ("mem_clock_mhz", "f4"),
    ("clock_event_reasons", "i8"),
    ("pcie_tx_bytes_s", "f4"),
    ("pcie_rx_bytes_s", "f4"),
    ("nvlink_tx_bytes_s", "f4"),
    ("nvlink_rx_bytes_s", "f4"),
    ("ib_tx_bytes_s", "f4"),
    ("ib_rx_bytes_s", "f4"),
    ("xid_last", "i8"),
    ("ecc_dbe_volatile", "i8"),
    ("ecc_sbe_volatile", "i8"),
    ("row_remap_failure", "i8"),
    ("nvlink_error_count", "i8"),
    ("pcie_replay_count", "i8"),]


def _type(dtype: str) -> sa.types.TypeEngine:
    if dtype == "f4":
        return sa.Float(precision=24).with_variant(sa.Float(), "sqlite")
    if dtype == "f8":
        return sa.Double()
    return sa.BigInteger()


def upgrade() -> None:
    op.create_table(
        "clusters",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(128), nullable=False),
        sa.UniqueConstraint("name", name="uq_clusters_name"),
    )
    op.create_table(
        "nodes",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("cluster_id", sa.Integer, sa.ForeignKey("clusters.id", name="fk_nodes_cluster_id_clusters"),
                  nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("agent_version", sa.String(64)),
        sa.Column("last_seen", sa.Double),
        sa.Column("labels", sa.JSON),
        sa.UniqueConstraint("cluster_id", "name", name="uq_nodes_cluster_name"),
    )
    op.create_table(
        "gpus",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("node_id", sa.Integer, sa.ForeignKey("nodes.id", name="fk_gpus_node_id_nodes"), nullable=False),
        sa.Column("uuid", sa.String(96), nullable=False),
        sa.Column("index", sa.Integer, nullable=False),
        sa.Column("model", sa.String(128)),
        sa.Column("mig_profile", sa.String(64)),
        sa.Column("parent_uuid", sa.String(96)),
        sa.Column("memory_total_bytes", sa.Double),
        sa.Column("last_seen", sa.Double),
        sa.UniqueConstraint("uuid", name="uq_gpus_uuid"),
    )
    op.create_index("ix_gpus_node_id", "gpus", ["node_id"])
    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("cluster_id", sa.Integer, sa.ForeignKey("clusters.id", name="fk_jobs_cluster_id_clusters"),
                  nullable=False),
        sa.Column("job_id", sa.String(255), nullable=False),
        sa.Column("source", sa.String(32), nullable=False),
        sa.Column("user", sa.String(255)),
        sa.Column("name", sa.String(512)),
        sa.Column("account", sa.String(255)),
        sa.Column("partition", sa.String(255)),
        sa.Column("namespace", sa.String(255)),
        sa.Column("num_nodes", sa.Integer),
        sa.Column("ntasks", sa.Integer),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("start_ts", sa.Double),
        sa.Column("end_ts", sa.Double),
        sa.Column("last_sample_ts", sa.Double),
        sa.Column("labels", sa.JSON),
        sa.UniqueConstraint("cluster_id", "job_id", name="uq_jobs_cluster_job"),
    )
    op.create_index("ix_jobs_user", "jobs", ["user"])
    op.create_index("ix_jobs_start_ts", "jobs", ["start_ts"])
    op.create_table(
        "allocations",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("job_pk", sa.Integer,
                  sa.ForeignKey("jobs.id", ondelete="CASCADE", name="fk_allocations_job_pk_jobs"), nullable=False),
        sa.Column("gpu_pk", sa.Integer, sa.ForeignKey("gpus.id", name="fk_allocations_gpu_pk_gpus"), nullable=False),
        sa.Column("start_ts", sa.Double, nullable=False),
        sa.Column("end_ts", sa.Double),
    )
    op.create_index("ix_allocations_job_start", "allocations", ["job_pk", "start_ts"])
    op.create_index("ix_allocations_gpu_start", "allocations", ["gpu_pk", "start_ts"])
    op.create_table(
        "gpu_samples",
        sa.Column("ts", sa.Double, nullable=False),
        sa.Column("gpu_pk", sa.Integer, nullable=False),
        sa.Column("job_pk", sa.Integer),
        *[sa.Column(name, _type(dtype)) for name, dtype in SAMPLE_FIELDS],
        # PostgreSQL: declarative range partitions by day on ts, created ahead by the
        # collector (gpufleet.storage.partitions); retention drops whole partitions.
        postgresql_partition_by="RANGE (ts)",
    )
    op.create_index("ix_gpu_samples_gpu_ts", "gpu_samples", ["gpu_pk", "ts"])
    op.create_index("ix_gpu_samples_job_ts", "gpu_samples", ["job_pk", "ts"])
    op.create_table(
        "events",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("ts", sa.Double, nullable=False),
        sa.Column("node_id", sa.Integer, sa.ForeignKey("nodes.id", name="fk_events_node_id_nodes"), nullable=False),
        sa.Column("gpu_pk", sa.Integer, sa.ForeignKey("gpus.id", name="fk_events_gpu_pk_gpus")),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("code", sa.Integer),
        sa.Column("message", sa.Text, nullable=False),
    )
    op.create_index("ix_events_node_ts", "events", ["node_id", "ts"])
    op.create_table(
        "flags",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("job_pk", sa.Integer, sa.ForeignKey("jobs.id", ondelete="CASCADE", name="fk_flags_job_pk_jobs"),
                  nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("scope", sa.String(255), nullable=False),
        sa.Column("severity", sa.String(16), nullable=False),
        sa.Column("start_ts", sa.Double, nullable=False),
        sa.Column("end_ts", sa.Double, nullable=False),
        sa.Column("wasted_gpu_hours", sa.Double, nullable=False),
        sa.Column("evidence", sa.JSON, nullable=False),
        sa.Column("suggestion", sa.Text, nullable=False),
        sa.Column("open", sa.Boolean, nullable=False),
        sa.Column("opened_at", sa.Double, nullable=False),
        sa.Column("resolved_at", sa.Double),
        sa.UniqueConstraint("job_pk", "kind", "scope", name="uq_flags_job_kind_scope"),
    )
    op.create_index("ix_flags_open", "flags", ["open"])
    op.create_table(
        "job_reports",
        sa.Column("job_pk", sa.Integer,
                  sa.ForeignKey("jobs.id", ondelete="CASCADE", name="fk_job_reports_job_pk_jobs"), primary_key=True),
        sa.Column("computed_at", sa.Double, nullable=False),
        sa.Column("analyzed_until", sa.Double, nullable=False),
        sa.Column("goodput_score", sa.Float),
        sa.Column("allocated_gpu_hours", sa.Double, nullable=False),
        sa.Column("wasted_gpu_hours", sa.Double, nullable=False),
        sa.Column("report", sa.JSON, nullable=False),
    )
    op.create_table(
        "ingest_batches",
        sa.Column("boot_id", sa.String(64), primary_key=True),
        sa.Column("seq", sa.BigInteger, primary_key=True),
        sa.Column("node_id", sa.Integer, sa.ForeignKey("nodes.id", name="fk_ingest_batches_node_id_nodes"),
                  nullable=False),
        sa.Column("received_at", sa.Double, nullable=False),
        sa.Column("rows", sa.Integer, nullable=False),
    )
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("cluster", sa.String(128)),
        sa.Column("node", sa.String(255)),
        sa.Column("created_at", sa.Double, nullable=False),
        sa.Column("revoked_at", sa.Double),
        sa.UniqueConstraint("name", name="uq_api_tokens_name"),
        sa.UniqueConstraint("token_hash", name="uq_api_tokens_token_hash"),
    )
    op.execute(sa.text("INSERT INTO clusters (name) VALUES ('default')"))


def downgrade() -> None:
    for t in ["api_tokens", "ingest_batches", "job_reports", "flags", "events", "gpu_samples",
              "allocations", "jobs", "gpus", "nodes", "clusters"]:
        op.drop_table(t)
