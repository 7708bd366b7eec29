"""`gpufleet worker`: placeholder until issue 5 (goodput engine) fills it in."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("worker", help="(not implemented yet)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    raise SystemExit("gpufleet worker: not implemented yet")
