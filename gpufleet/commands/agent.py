"""`gpufleet agent`: placeholder until issue 3 (agent) fills it in."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("agent", help="(not implemented yet)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    raise SystemExit("gpufleet agent: not implemented yet")
