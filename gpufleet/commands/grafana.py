"""`gpufleet grafana`: placeholder until issue 8 (grafana) fills it in."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("grafana", help="(not implemented yet)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    raise SystemExit("gpufleet grafana: not implemented yet")
