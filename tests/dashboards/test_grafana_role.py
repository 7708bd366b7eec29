"""Migration 0004: Grafana's read-only role, views and indexes on PostgreSQL; nothing on SQLite;
reversible; safe with several databases on one server (roles are cluster-global)."""

from __future__ import annotations

import os
import uuid
from typing import Any

import pytest
from sqlalchemy import inspect, text

from gpufleet.storage.db import make_engine
from gpufleet.storage.migrate import downgrade, upgrade

ROLE = "gpufleet_grafana"
VIEWS = {"grafana_gpus", "grafana_jobs", "grafana_flags"}


def _q(url: str, sql: str, **params: Any) -> Any:
    e = make_engine(url)
    try:
        with e.connect() as c:
            return c.execute(text(sql), params).fetchall()
    finally:
        e.dispose()


def _can(url: str, obj: str, priv: str = "SELECT") -> bool:
    return bool(_q(url, "SELECT has_table_privilege(:r, :o, :p)", r=ROLE, o=obj, p=priv)[0][0])


def test_role_reads_telemetry_and_views_only(pg_url: str) -> None:
    (login, settings), = _q(pg_url, "SELECT rolcanlogin, coalesce((SELECT setconfig FROM pg_db_role_setting s "
                                    "WHERE s.setrole = r.oid AND s.setdatabase = 0), '{}') FROM pg_roles r "
                                    "WHERE rolname = :r", r=ROLE)
    assert login
    assert "default_transaction_read_only=on" in settings
    for obj in ("jobs", "gpu_samples_1m", "job_samples_1m", "flags", "events", "gpu_ledger", "serving_minutes",
                "serving_deployments", *VIEWS):  # the ledger and serving tables: migration 0017
        assert _can(pg_url, obj), obj
    for secret in ("api_tokens", "ingest_batches"):
        assert not _can(pg_url, secret), f"Grafana must not read {secret}"
    for write in ("INSERT", "UPDATE", "DELETE"):
        assert not _can(pg_url, "jobs", write)
    assert {r[0] for r in _q(pg_url, "SELECT viewname FROM pg_views WHERE viewname LIKE 'grafana_%'")} == VIEWS
    indexes = {r[0] for r in _q(pg_url, "SELECT indexname FROM pg_indexes")}
    assert {"ix_flags_end_ts", "ix_jobs_end_or_running", "ix_gpu_samples_1m_bucket_brin"} <= indexes


def test_overlap_function_prorates(pg_url: str) -> None:
    rows = _q(pg_url, "SELECT grafana_overlap(0, 100, 50, 200), grafana_overlap(0, 100, 200, 300), "
                      "grafana_overlap(10, 10, 0, 20), grafana_overlap(10, 10, 30, 40)")
    assert rows[0] == (0.5, 0.0, 1.0, 0.0)


def test_sqlite_is_a_no_op(sqlite_url: str) -> None:
    e = make_engine(sqlite_url)
    try:
        assert not [v for v in inspect(e).get_view_names() if v.startswith("grafana_")]
    finally:
        e.dispose()
    downgrade(sqlite_url, "0003")
    upgrade(sqlite_url, "head")


def test_downgrade_removes_it_and_upgrade_restores_it(pg_url: str, pg_factory: Any) -> None:
    other = pg_factory.migrated()  # a second database granting the same cluster-global role
    downgrade(pg_url, "0003")
    assert not _q(pg_url, "SELECT viewname FROM pg_views WHERE viewname LIKE 'grafana_%'")
    assert not _q(pg_url, "SELECT 1 FROM pg_proc WHERE proname = 'grafana_overlap'")
    assert not _q(pg_url, "SELECT 1 FROM pg_indexes WHERE indexname IN ('ix_flags_end_ts', 'ix_jobs_end_or_running', "
                          "'ix_gpu_samples_1m_bucket_brin', 'ix_job_samples_1m_bucket_brin')")
    assert not _can(pg_url, "jobs")
    # The role survives for the database that still uses it ...
    assert _q(pg_url, "SELECT 1 FROM pg_roles WHERE rolname = :r", r=ROLE)
    assert _can(other, "jobs") and _can(other, "grafana_jobs")
    # ... and upgrading again, with the role already there, restores everything.
    upgrade(pg_url, "head")
    assert _can(pg_url, "grafana_flags") and not _can(pg_url, "api_tokens")


def test_migrating_as_a_database_owner_without_createrole(pg_factory: Any) -> None:
    """Production migrations usually run as the database's owner, not a superuser: 0004 must
    still succeed, and grant to the role when it exists."""
    import psycopg

    owner = f"gpufleet_t{os.getpid()}_owner_{uuid.uuid4().hex[:6]}"
    db = f"gpufleet_t{os.getpid()}_{uuid.uuid4().hex[:10]}"
    admin = pg_factory.admin_url
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(f'CREATE ROLE "{owner}" LOGIN NOCREATEROLE NOSUPERUSER')
        c.execute(f'CREATE DATABASE "{db}" OWNER "{owner}"')
    try:
        from sqlalchemy.engine import make_url

        url = make_url(pg_factory.url_for(db)).set(username=owner, password=None).render_as_string(
            hide_password=False)
        try:
            upgrade(url)
        except Exception as e:  # a server that wants passwords: say so rather than pass silently
            if "password" in str(e).lower():
                pytest.skip(f"the test server requires a password for {owner}: {e}")
            raise
        assert {r[0] for r in _q(url, "SELECT viewname FROM pg_views WHERE viewname LIKE 'grafana_%'")} == VIEWS
        if _q(url, "SELECT 1 FROM pg_roles WHERE rolname = :r", r=ROLE):
            assert _can(url, "grafana_jobs") and not _can(url, "api_tokens")
        downgrade(url, "0003")
    finally:
        with psycopg.connect(admin, autocommit=True) as c:
            c.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (db,))
            c.execute(f'DROP DATABASE IF EXISTS "{db}"')
            c.execute(f'DROP ROLE IF EXISTS "{owner}"')
