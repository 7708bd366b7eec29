"""Run Alembic migrations programmatically (``gpufleet migrate``, ``gpufleet up``, tests)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

import gpufleet.migrations

MIGRATIONS_DIR = Path(gpufleet.migrations.__file__).parent


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    cfg.attributes["url"] = url
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    from gpufleet.storage.db import normalise

    command.upgrade(alembic_config(normalise(url)), revision)


def downgrade(url: str, revision: str = "base") -> None:
    from gpufleet.storage.db import normalise

    command.downgrade(alembic_config(normalise(url)), revision)


def current(url: str) -> str | None:
    from alembic.runtime.migration import MigrationContext

    from gpufleet.storage.db import make_engine

    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()
