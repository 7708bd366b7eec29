"""Storage: SQLAlchemy models, engines, writes and queries. SQLite embedded, PostgreSQL in
production, same Alembic revisions for both. Imports only gpufleet core."""
