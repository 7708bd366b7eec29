"""The ``gpufleet`` command. Each subcommand lives in ``gpufleet/commands/<name>.py`` with a
``register(subparsers)`` that only declares arguments; heavy imports happen when the
command runs, so ``gpufleet agent`` works on a node with only ``gpufleet[agent]``."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from gpufleet import __version__

COMMANDS = ["up", "serve", "agent", "migrate", "analyze", "import_", "token", "gpu", "worker", "beat", "alerts",
            "grafana", "config"]


def missing_module_hint(e: ModuleNotFoundError, command: str) -> str:
    """What to install, or why gpufleet's own module is not found (a checkout's gpufleet/
    folder in the working directory shadows the package: it holds the core, not agent/)."""
    missing = e.name or str(e)
    if missing == "gpufleet" or missing.startswith("gpufleet."):
        import gpufleet

        return (f"gpufleet's own module {missing!r} is not found next to {gpufleet.__file__}. "
                "Is a gpufleet source checkout the working directory? Run from another directory, "
                "or install it: pip install -e '.[agent]'")
    extra = "agent" if command == "agent" else "server"
    return (f"needs the Python package {missing!r}, which is not installed. "
            f"Install the {extra} parts with: pip install 'gpufleet[{extra}]'")


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
        print(f"gpufleet {args.command}: {missing_module_hint(e, args.command)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
