"""`gpufleet import`: placeholder until the collector work (issue 4) fills it in."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("import", help="(not implemented yet)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    raise SystemExit("gpufleet import: not implemented yet")
