"""`gpufleet alerts`: placeholder until issue 7 (alerts) fills it in."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("alerts", help="(not implemented yet)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    raise SystemExit("gpufleet alerts: not implemented yet")
