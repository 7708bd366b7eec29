"""Migrations: the same revisions on SQLite and PostgreSQL, reversible, and in step with
the models and the metric catalog."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from gpufleet.catalog import CATALOG
from gpufleet.storage.db import make_engine
from gpufleet.storage.migrate import downgrade, upgrade
from gpufleet.storage.models import Base


def _tables(url: str) -> set[str]:
    e = make_engine(url)
    try:
        return set(inspect(e).get_table_names()) - {"alembic_version"}
    finally:
        e.dispose()


def test_upgrade_downgrade_upgrade(database_url: str) -> None:
    # database_url arrives at head; walk it all the way down and back up.
    assert {"jobs", "gpu_sample_blocks", "flags", "allocations"} <= _tables(database_url)
    downgrade(database_url, "base")
    assert _tables(database_url) == set()
    upgrade(database_url, "head")
    assert {"clusters", "nodes", "gpus", "jobs", "allocations", "gpu_sample_blocks", "events", "flags"} <= _tables(
        database_url
    )


def test_models_match_migrations(database_url: str) -> None:
    """Autogenerate finds nothing to do: the models and migrations describe one schema."""
    e = make_engine(database_url)
    try:
        with e.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": False})
            diff = compare_metadata(ctx, Base.metadata)
    finally:
        e.dispose()
    # Indexes/constraints that PostgreSQL partitioning or dialect specifics rename are
    # compared by the tests of the migrations that add them; tables and columns here.
    relevant = [d for d in diff if d[0] in ("add_table", "remove_table", "add_column", "remove_column")]
    assert relevant == [], relevant


def test_every_catalog_field_has_a_rollup_column(database_url: str) -> None:
    # Raw samples are blocks holding every catalog field (storage/sample_codec.py); the
    # 1-minute rollups have a column per field.
    e = make_engine(database_url)
    try:
        cols = {c["name"] for c in inspect(e).get_columns("gpu_samples_1m")}
    finally:
        e.dispose()
    missing = [f for f in CATALOG.names if f not in cols]
    assert not missing, f"catalog fields without a gpu_samples_1m column (add a migration): {missing}"


def test_default_cluster_exists(engine) -> None:  # type: ignore[no-untyped-def]
    from sqlalchemy import text

    with engine.connect() as c:
        assert c.execute(text("select name from clusters")).scalars().all() == ["default"]
