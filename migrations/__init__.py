"""The migrations package: Alembic revisions under `versions/`."""
