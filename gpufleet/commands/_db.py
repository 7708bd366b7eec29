"""Shared arguments for server-side commands that open the database."""

from __future__ import annotations

import argparse


def add_database_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--database-url", default=None,
                   help="SQLAlchemy URL (sqlite:///... or postgresql://...); default $GPUFLEET_DATABASE_URL, "
                        "else SQLite under --data-dir")
    p.add_argument("--data-dir", default=None,
                   help="directory for the embedded SQLite database (default ./gpufleet-data)")


def database_url(args: argparse.Namespace) -> str:
    from gpufleet.storage.db import resolve_url

    return resolve_url(args.database_url, args.data_dir)
