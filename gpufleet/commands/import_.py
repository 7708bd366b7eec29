"""`gpufleet import FILE [--cluster C]`: load NDJSON samples (one JSON object per line).

Every line is validated before anything is written; then the whole file is stored in one
transaction, so a bad line leaves the database untouched. ``-`` reads standard input.
Format: docs/collector.md."""

from __future__ import annotations

import argparse

from gpufleet.commands._db import add_database_args, database_url


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("import", help="import NDJSON samples (validated first, stored all or nothing)")
    p.add_argument("file", help="NDJSON file (.gz/.zst decompressed), or - for standard input")
    p.add_argument("--cluster", default=None, help="cluster for lines without a \"cluster\" (default: default)")
    add_database_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import os
    import shutil
    import sys
    import tempfile

    from gpufleet.collector.ndjson import ImportError_, import_file
    from gpufleet.storage.db import make_engine

    path = args.file
    tmp = None
    if path == "-":  # two passes need a seekable file: spool stdin
        fd, tmp = tempfile.mkstemp(prefix="gpufleet-import-", suffix=".ndjson")
        with os.fdopen(fd, "wb") as f:
            shutil.copyfileobj(sys.stdin.buffer, f, 1 << 20)
        path = tmp
    elif not os.path.exists(path):
        print(f"gpufleet import: {path}: no such file", file=sys.stderr)
        return 2
    engine = make_engine(database_url(args))
    try:
        res = import_file(engine, path, cluster=args.cluster)
    except ImportError_ as e:
        print(f"gpufleet import: {args.file}: {e.detail}; nothing was imported", file=sys.stderr)
        return 1
    finally:
        engine.dispose()
        if tmp:
            os.unlink(tmp)
    if res.duplicate:
        print(f"{args.file}: already imported ({res.lines} samples); nothing stored again")
    else:
        print(f"{args.file}: stored {res.stored} samples of {res.jobs} jobs on {res.nodes} nodes "
              f"in {res.seconds:.1f} s")
    return 0
