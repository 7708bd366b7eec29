"""grafana: read-only role, views and indexes the dashboards read (issue 8)

PostgreSQL only: Grafana's PostgreSQL data source is the supported way to read gpufleet from
Grafana, so on SQLite this revision does nothing.

- ``gpufleet_grafana``: a LOGIN role with SELECT on the telemetry tables and the ``grafana_*``
  views, and nothing else (no api_tokens, no ingest ledger, no alert/webhook tables). Its
  sessions default to read-only transactions with a statement timeout, so a heavy panel cannot
  hold locks or run away. It has no password: set one with
  ``ALTER ROLE gpufleet_grafana PASSWORD '...'`` (docs/grafana.md).
  Roles are cluster-global while grants are per database, so the role is created only when
  missing (and a concurrent creator is tolerated) and downgrade drops it only when no other
  database still grants it anything.
- ``grafana_gpus``, ``grafana_jobs``, ``grafana_flags``: joins the panels would otherwise repeat.
- ``grafana_overlap(s, e, f, t)``: fraction of [s, e] inside [f, t], to prorate waste to a range.
- Indexes for the panels: BRIN on the rollups' ``bucket`` (fleet-wide panels filter on time
  alone, which the (gpu_pk, bucket) and (job_pk, bucket) b-trees cannot serve; rollups are
  appended in time order, so a BRIN index is a few pages per GiB), findings and jobs by end time.
  ("running jobs" panels use 0002's partial index ix_jobs_running.)

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from __future__ import annotations

import logging

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

log = logging.getLogger("gpufleet.migrations")

ROLE = "gpufleet_grafana"

# What Grafana may read. Listed, not "ALL TABLES": tables added later (tokens, webhooks) must
# not become readable by accident.
READABLE_TABLES = (
    "clusters", "nodes", "gpus", "jobs", "allocations", "events", "flags", "job_reports",
    "gpu_samples", "gpu_samples_1m", "job_samples_1m",
)

VIEWS = {
    "grafana_gpus": """
        SELECT g.id AS gpu_id, g.uuid, g."index" AS gpu_index, g.model, g.mig_profile,
               g.memory_total_bytes, g.last_seen,
               n.id AS node_id, n.name AS node, n.last_seen AS node_last_seen, n.agent_version,
               c.id AS cluster_id, c.name AS cluster,
               n.name || '/' || g."index" AS gpu_label
        FROM gpus g
        JOIN nodes n ON n.id = g.node_id
        JOIN clusters c ON c.id = n.cluster_id
    """,
    # team: the Slurm account, else the Kubernetes namespace.
    "grafana_jobs": """
        SELECT j.id AS job_pk, c.name AS cluster, j.job_id, j."user" AS username, j.name,
               j.account, j.partition, j.namespace,
               COALESCE(NULLIF(j.account, ''), NULLIF(j.namespace, ''), '(none)') AS team,
               j.source, j.state, j.start_ts, j.end_ts, j.last_sample_ts, j.num_nodes,
               r.goodput_score, r.allocated_gpu_hours, r.wasted_gpu_hours, r.computed_at
        FROM jobs j
        JOIN clusters c ON c.id = j.cluster_id
        LEFT JOIN job_reports r ON r.job_pk = j.id
    """,
    "grafana_flags": """
        SELECT f.id AS flag_id, f.job_pk, j.cluster, j.job_id, j.username, j.team,
               f.kind AS cause, f.scope, f.severity, f.start_ts, f.end_ts, f.wasted_gpu_hours,
               f.suggestion, f.open
        FROM flags f
        JOIN grafana_jobs j ON j.job_pk = f.job_pk
    """,
}

# A plain SQL function: PostgreSQL inlines it into the calling query.
OVERLAP_FN = """
CREATE OR REPLACE FUNCTION grafana_overlap(s double precision, e double precision,
                                           f double precision, t double precision)
RETURNS double precision LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN e <= s THEN CASE WHEN s BETWEEN f AND t THEN 1.0 ELSE 0.0 END
                ELSE greatest(0.0, least(e, t) - greatest(s, f)) / (e - s) END
$$
"""

INDEXES = {
    "ix_gpu_samples_1m_bucket_brin": "gpu_samples_1m USING brin (bucket)",
    "ix_job_samples_1m_bucket_brin": "job_samples_1m USING brin (bucket)",
    # Panels select findings and jobs overlapping the range; "ended after its start" is the
    # selective side (a running job's end counts as infinity).
    "ix_flags_end_ts": "flags (end_ts)",
    "ix_jobs_end_or_running": "jobs ((coalesce(end_ts, 'infinity'::double precision)))",
}

# Create-if-missing that survives another database's migration creating it at the same time.
CREATE_ROLE = f"""
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{ROLE}') THEN
        BEGIN
            CREATE ROLE {ROLE} LOGIN NOINHERIT;
            -- Set only by whoever creates the role: ALTER ROLE from two databases at once
            -- can fail with "tuple concurrently updated".
            ALTER ROLE {ROLE} SET default_transaction_read_only = on;
            ALTER ROLE {ROLE} SET statement_timeout = '30s';
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL;
        END;
    END IF;
END
$$
"""

# Keep the role when another database still grants it something (pg_shdepend is cluster-wide).
DROP_ROLE = f"""
DO $$
BEGIN
    DROP ROLE IF EXISTS {ROLE};
EXCEPTION WHEN dependent_objects_still_exist THEN
    RAISE NOTICE 'role {ROLE} is still used by another database; kept';
END
$$
"""


def _is_postgres() -> bool:
    return op.get_bind().dialect.name == "postgresql"


def _may_manage_roles() -> bool:
    row = op.get_bind().execute(
        sa.text("SELECT rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = current_user")
    ).scalar()
    return bool(row)


def _role_exists() -> bool:
    return bool(op.get_bind().execute(sa.text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": ROLE}).scalar())


def upgrade() -> None:
    if not _is_postgres():
        return
    for name, ddl in INDEXES.items():
        op.execute(f"CREATE INDEX IF NOT EXISTS {name} ON {ddl}")
    op.execute(OVERLAP_FN)
    for name, body in VIEWS.items():
        op.execute(f"CREATE OR REPLACE VIEW {name} AS {body}")

    if _may_manage_roles():
        op.execute(CREATE_ROLE)
    elif not _role_exists():
        log.warning(
            "gpufleet: the migrating user may not create roles, so the read-only Grafana role %s was "
            "not created. Ask a DBA to run: CREATE ROLE %s LOGIN NOINHERIT; then rerun "
            "'gpufleet migrate' or grant as in docs/grafana.md", ROLE, ROLE,
        )
        return
    op.execute(f"GRANT CONNECT ON DATABASE {_current_database()} TO {ROLE}")
    op.execute(f"GRANT USAGE ON SCHEMA {_current_schema()} TO {ROLE}")
    objects = ", ".join((*READABLE_TABLES, *VIEWS))
    op.execute(f"GRANT SELECT ON {objects} TO {ROLE}")
    op.execute(f"GRANT EXECUTE ON FUNCTION grafana_overlap(double precision, double precision, "
               f"double precision, double precision) TO {ROLE}")


def downgrade() -> None:
    if not _is_postgres():
        return
    if _role_exists():
        objects = ", ".join((*READABLE_TABLES, *VIEWS))
        op.execute(f"REVOKE ALL ON {objects} FROM {ROLE}")
        op.execute(f"REVOKE ALL ON FUNCTION grafana_overlap(double precision, double precision, "
                   f"double precision, double precision) FROM {ROLE}")
        op.execute(f"REVOKE ALL ON SCHEMA {_current_schema()} FROM {ROLE}")
        op.execute(f"REVOKE ALL ON DATABASE {_current_database()} FROM {ROLE}")
        if _may_manage_roles():
            op.execute(DROP_ROLE)
    for name in reversed(list(VIEWS)):
        op.execute(f"DROP VIEW IF EXISTS {name}")
    op.execute("DROP FUNCTION IF EXISTS grafana_overlap(double precision, double precision, "
               "double precision, double precision)")
    for name in INDEXES:
        op.execute(f"DROP INDEX IF EXISTS {name}")


def _current_database() -> str:
    name = op.get_bind().execute(sa.text("SELECT current_database()")).scalar()
    return _quote(str(name))


def _current_schema() -> str:
    name = op.get_bind().execute(sa.text("SELECT current_schema()")).scalar()
    return _quote(str(name))


def _quote(ident: str) -> str:
    return '"' + ident.replace('"', '""') + '"'
