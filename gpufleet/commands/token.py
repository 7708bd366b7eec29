"""`gpufleet token create|list|revoke`: bearer tokens for agents and people."""

from __future__ import annotations

import argparse

from gpufleet.commands._db import add_database_args, database_url

ROLES = ("agent", "viewer", "operator", "admin")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("token", help="create, list and revoke API tokens")
    tsub = p.add_subparsers(dest="token_command", metavar="ACTION", required=True)
    c = tsub.add_parser("create", help="create a token (its value is printed once)")
    c.add_argument("name")
    c.add_argument("--role", required=True, choices=ROLES,
                   help="agent (writes telemetry), viewer, operator, admin")
    c.add_argument("--cluster", default=None, help="agent: writes only this cluster; viewer: reads only this "
                   "cluster (not for operator/admin)")
    c.add_argument("--node", default=None, help="restrict an agent token to this node")
    add_database_args(c)
    ls = tsub.add_parser("list", help="list tokens (never their values)")
    add_database_args(ls)
    r = tsub.add_parser("revoke", help="revoke a token by name")
    r.add_argument("name")
    add_database_args(r)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import datetime as dt

    from gpufleet.storage import tokens
    from gpufleet.storage.db import make_engine

    engine = make_engine(database_url(args))
    try:
        if args.token_command == "create":
            try:
                raw = tokens.create_token(engine, args.name, args.role, args.cluster, args.node)
            except ValueError as e:
                print(f"gpufleet token create: {e}")
                return 2
            print(raw)
            return 0
        if args.token_command == "list":
            rows = tokens.list_tokens(engine)
            print(f"{'NAME':24} {'ROLE':9} {'CLUSTER':14} {'NODE':20} {'CREATED':20} REVOKED")
            for r in rows:
                def t(x: float | None) -> str:
                    return dt.datetime.fromtimestamp(x, dt.UTC).strftime("%Y-%m-%d %H:%M:%S") if x else "-"
                print(f"{r['name']:24} {r['role']:9} {r['cluster'] or '*':14} {r['node'] or '*':20} "
                      f"{t(r['created_at']):20} {t(r['revoked_at'])}")
            return 0
        if args.token_command == "revoke":
            if tokens.revoke_token(engine, args.name):
                print(f"revoked {args.name}")
                return 0
            print(f"gpufleet token revoke: no active token named {args.name!r}")
            return 1
    finally:
        engine.dispose()
    return 2
