"""The ``gpufleet`` command. Each subcommand lives in ``gpufleet/commands/<name>.py`` with a
``register(subparsers)`` that only declares arguments; heavy imports happen when the
command runs, so ``gpufleet agent`` works on a node with only ``gpufleet[agent]``."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from gpufleet import __version__

COMMANDS = ["up", "serve", "agent", "migrate", "analyze", "import_", "token", "worker", "beat", "alerts", "grafana",
            "config"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpufleet", description="GPU fleet telemetry and goodput.")
    p.add_argument("--version", action="version", version=f"gpufleet {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"gpufleet.commands.{name}").register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # One line per HTTP request drowns what matters; failures are logged by our own code.
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.DEBUG if args.verbose else logging.WARNING)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except ModuleNotFoundError as e:
        missing = e.name or str(e)
        print(
            f"gpufleet {args.command}: needs the Python package {missing!r}, which is not installed. "
            f"Install the server parts with: pip install 'gpufleet[server]'",
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":
    sys.exit(main())
