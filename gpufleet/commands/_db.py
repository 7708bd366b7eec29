"""Shared arguments for server-side commands, and the one place a command builds its Settings:
the environment first (``Settings.from_env``), then the command's flags over it."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpufleet.settings import Settings


def add_database_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--database-url", default=None,
                   help="SQLAlchemy URL (sqlite:///... or postgresql://...); default $GPUFLEET_DATABASE_URL, "
                        "else SQLite under --data-dir")
    p.add_argument("--data-dir", default=None,
                   help="directory for the embedded SQLite database (default $GPUFLEET_DATA_DIR, else ./gpufleet-data)")


def settings_from_args(args: argparse.Namespace, **sections: dict[str, Any]) -> Settings:
    """Settings for this command: environment, then --database-url/--data-dir (when the command
    has them and they were given), then ``sections`` (the command's other flags). A bad value
    exits 2 naming the variable or flag."""
    from gpufleet.settings import Settings, SettingsError

    db = {k: v for k, v in (("url", getattr(args, "database_url", None)),
                            ("data_dir", getattr(args, "data_dir", None))) if v is not None}
    if db:
        sections = {**sections, "database": {**db, **sections.get("database", {})}}
    try:
        s = Settings.from_env()
        return s.replace(**{k: v for k, v in sections.items() if v}) if sections else s
    except (SettingsError, ValueError) as e:
        print(f"gpufleet {getattr(args, 'command', '')}: bad setting: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def database_url(args: argparse.Namespace) -> str:
    return settings_from_args(args).database_url()
