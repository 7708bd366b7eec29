"""`gpufleet grafana push`: upload gpufleet's PostgreSQL data source and dashboards to a
Grafana over its HTTP API (grafana-client), so nothing needs copying onto the Grafana host.

    gpufleet grafana push --url https://grafana.example --token glsa_... \\
        --datasource-url 'postgresql://gpufleet_grafana:PASSWORD@db:5432/gpufleet?sslmode=require'

Idempotent: the data source (uid ``gpufleet-pg``) and the folder (uid ``gpufleet``) are created
or updated, and each dashboard is saved with ``overwrite``. The dashboards are the generated
JSON in ``dashboards/json`` (see docs/grafana.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

DATASOURCE_UID = "gpufleet-pg"
DATASOURCE_TYPE = "grafana-postgresql-datasource"
GRAFANA_ROLE = "gpufleet_grafana"
FOLDER_UID = "gpufleet"
# An installed wheel ships them as package data (gpufleet/dashboards: setup.py DATA_ROOTS); a
# source checkout keeps them in dashboards/json; GPUFLEET_DASHBOARDS_DIR overrides either.
_PACKAGED = Path(__file__).resolve().parents[1] / "dashboards"
DEFAULT_DASHBOARDS = _PACKAGED if _PACKAGED.is_dir() else Path(__file__).resolve().parents[2] / "dashboards" / "json"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("grafana", help="Grafana integration: upload the data source and dashboards")
    gsub = p.add_subparsers(dest="grafana_command", metavar="SUBCOMMAND")
    push = gsub.add_parser("push", help="create or update the data source, folder and dashboards in a Grafana")
    # GRAFANA_URL / GRAFANA_TOKEN: the names Grafana's own tools use; read here, not settings
    # (they are this command's, not the server's).
    push.add_argument("--url", default=os.environ.get("GRAFANA_URL"),
                      help="Grafana base URL (default $GRAFANA_URL, else $GPUFLEET_GRAFANA_URL)")
    push.add_argument("--token", default=os.environ.get("GRAFANA_TOKEN"),
                      help="service account token (Bearer), or USER:PASSWORD for basic auth (default $GRAFANA_TOKEN)")
    push.add_argument("--datasource-url", default=None,
                      help="how GRAFANA reaches gpufleet's PostgreSQL, as postgresql://USER:PASSWORD@HOST:PORT/DB"
                           "?sslmode=MODE; use the read-only role gpufleet_grafana "
                           "(default $GPUFLEET_GRAFANA_DATASOURCE_URL)")
    push.add_argument("--no-datasource", action="store_true", help="upload dashboards only")
    push.add_argument("--datasource-name", default="gpufleet", help="data source name shown in Grafana")
    push.add_argument("--folder", default="gpufleet", help="Grafana folder title (uid 'gpufleet')")
    push.add_argument("--dashboards", type=Path, default=None,
                      help="directory of dashboard JSON files "
                           f"(default $GPUFLEET_DASHBOARDS_DIR, else {DEFAULT_DASHBOARDS})")
    push.add_argument("--timeout", type=float, default=30.0, help="HTTP timeout in seconds")
    push.add_argument("--dry-run", action="store_true", help="print what would be uploaded, send nothing")
    p.set_defaults(func=run, _grafana_parser=p)


def datasource_payload(url: str, name: str = "gpufleet") -> dict[str, Any]:
    """The Grafana data source JSON for a ``postgresql://`` URL (same fields as
    dashboards/provisioning/datasources/gpufleet.yaml)."""
    u = urlsplit(url)
    if u.scheme.split("+")[0] not in ("postgresql", "postgres") or not u.hostname or not u.path.strip("/"):
        raise ValueError(f"--datasource-url must look like postgresql://USER:PASSWORD@HOST:PORT/DATABASE, got {url!r}")
    query = parse_qs(u.query)
    payload: dict[str, Any] = {
        "name": name,
        "uid": DATASOURCE_UID,
        "type": DATASOURCE_TYPE,
        "access": "proxy",
        "url": f"{u.hostname}:{u.port or 5432}",
        "user": unquote(u.username or GRAFANA_ROLE),
        "basicAuth": False,
        "isDefault": False,
        "jsonData": {
            "database": unquote(u.path.strip("/")),
            "sslmode": query.get("sslmode", ["require"])[0],
            "postgresVersion": 1500,
            "timescaledb": False,
            "timeInterval": "1m",
            "maxOpenConns": 10,
            "maxIdleConns": 10,
            "connMaxLifetime": 14400,
        },
        "secureJsonData": {"password": unquote(u.password or "")},
    }
    return payload


def load_dashboards(directory: Path) -> list[dict[str, Any]]:
    files = sorted(directory.glob("*.json")) if directory.is_dir() else []
    if not files:
        raise FileNotFoundError(f"no dashboard JSON in {directory}: pass --dashboards DIR "
                                f"(the repository's dashboards/json)")
    return [json.loads(f.read_text()) for f in files]


def _credential(token: str) -> str | tuple[str, str]:
    # Service account tokens and API keys never contain ':'; USER:PASSWORD means basic auth.
    if ":" in token:
        user, _, password = token.partition(":")
        return (user, password)
    return token


def _upsert_datasource(api: Any, payload: dict[str, Any]) -> str:
    from grafana_client.client import GrafanaClientError

    try:
        existing = api.datasource.get_datasource_by_uid(DATASOURCE_UID)
    except GrafanaClientError as e:
        if e.status_code != 404:
            raise
        api.datasource.create_datasource(payload)
        return "created"
    body = {**payload, "id": existing.get("id"), "version": existing.get("version")}
    api.datasource.update_datasource_by_uid(DATASOURCE_UID, body)
    return "updated"


def _ensure_folder(api: Any, title: str) -> str:
    from grafana_client.client import GrafanaClientError

    try:
        api.folder.get_folder(FOLDER_UID)
        return "exists"
    except GrafanaClientError as e:
        if e.status_code != 404:
            raise
    api.folder.create_folder(title, uid=FOLDER_UID)
    return "created"


def push(args: argparse.Namespace) -> int:
    from grafana_client import GrafanaApi
    from grafana_client.client import GrafanaException

    dashboards = load_dashboards(args.dashboards)
    payload = None if args.no_datasource else datasource_payload(args.datasource_url, args.datasource_name)
    if args.dry_run:
        shown = None if payload is None else {**payload, "secureJsonData": {"password": "***"}}
        print(json.dumps({"datasource": shown, "folder": {"uid": FOLDER_UID, "title": args.folder},
                          "dashboards": [d["uid"] for d in dashboards]}, indent=2))
        return 0
    api = GrafanaApi.from_url(args.url, credential=_credential(args.token), timeout=args.timeout)
    try:
        if payload is not None:
            print(f"data source {DATASOURCE_UID}: {_upsert_datasource(api, payload)}")
        print(f"folder {FOLDER_UID}: {_ensure_folder(api, args.folder)}")
        for d in dashboards:
            body = {"dashboard": {**d, "id": None}, "folderUid": FOLDER_UID, "overwrite": True,
                    "message": "gpufleet grafana push"}
            res = api.dashboard.update_dashboard(body)
            print(f"dashboard {d['uid']}: {res.get('status', 'saved')} {res.get('url', '')}".rstrip())
    except GrafanaException as e:
        print(f"gpufleet grafana push: Grafana at {args.url} answered {e.status_code}: {e}. "
              "Check --url and that --token belongs to a service account with the Editor role "
              "(Admin to manage data sources).", file=sys.stderr)
        return 1
    except OSError as e:  # connection refused, DNS, TLS
        print(f"gpufleet grafana push: cannot reach Grafana at {args.url}: {e}", file=sys.stderr)
        return 1
    return 0


def _fill_from_settings(args: argparse.Namespace) -> None:
    from gpufleet.commands._db import settings_from_args

    g = settings_from_args(args).grafana
    args.url = args.url or g.url or None
    args.datasource_url = args.datasource_url or g.datasource_url
    args.dashboards = args.dashboards or g.dashboards_dir or DEFAULT_DASHBOARDS


def run(args: argparse.Namespace) -> int:
    if getattr(args, "grafana_command", None) != "push":
        args._grafana_parser.print_help()
        return 2
    _fill_from_settings(args)
    if not args.dry_run and (not args.url or not args.token):
        print("gpufleet grafana push: --url and --token are required (or $GRAFANA_URL and $GRAFANA_TOKEN)",
              file=sys.stderr)
        return 2
    if not args.no_datasource and not args.datasource_url:
        print("gpufleet grafana push: --datasource-url is required (how Grafana reaches gpufleet's PostgreSQL, "
              "e.g. postgresql://gpufleet_grafana:PASSWORD@db:5432/gpufleet?sslmode=require), "
              "or --no-datasource to upload dashboards only", file=sys.stderr)
        return 2
    try:
        return push(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"gpufleet grafana push: {e}", file=sys.stderr)
        return 2
