"""Deliver a copied agent spool to a collector: the batches a node made while its collector was
unreachable (or on another network), sent with the agent's own sender and retry rules, so each
is stored once however often this runs (the collector de-duplicates by idempotency key).

    python bench/agent/replay_spool.py SPOOL_DIR --collector http://127.0.0.1:8000 [--token T]

SPOOL_DIR is the agent's --spool-dir (its queue/ holds <order>-<rows>.batch files), or a .tgz of
one (bench/agent/real_gpu_session.sh leaves spool.tgz). Works on a copy: the source is never
changed. Prints what was sent and what the collector refused for good (dead letters, with the
reason). Exit 0 when every batch was delivered, 1 otherwise.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path


def _copy(src: Path, into: Path) -> Path:
    """A private copy of the spool's queue: sending acknowledges (deletes) batches."""
    if src.is_file():
        with tarfile.open(src) as tar:
            tar.extractall(into, filter="data")
        queues = sorted(into.rglob("queue"))
        if not queues:
            raise SystemExit(f"{src}: no queue/ folder in the archive")
        src = queues[0].parent
    elif not (src / "queue").is_dir():
        raise SystemExit(f"{src}: not an agent spool (no queue/ folder)")
    dst = into / "spool"
    shutil.copytree(src / "queue", dst / "queue")
    return dst


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("spool", type=Path)
    ap.add_argument("--collector", required=True, metavar="URL")
    ap.add_argument("--token")
    ap.add_argument("--deadline", type=float, default=120.0, help="seconds to keep trying (default 120)")
    args = ap.parse_args(argv)

    from gpufleet.agent.sender import Sender
    from gpufleet.agent.spool import Spool

    with tempfile.TemporaryDirectory(prefix="gf-replay-") as tmp:
        spool = Spool(_copy(args.spool, Path(tmp)), max_bytes=2**40, fsync=False)
        total, rows = len(spool), spool.pending_rows
        sender = Sender(spool, args.collector, token=args.token, backoff_base_s=0.2, backoff_max_s=5.0)
        try:
            sent = sender.drain(args.deadline)
        finally:
            sender.close()
        dead = sorted(spool.dead_dir.glob("*.batch")) if spool.dead_dir.exists() else []
        print(f"{total} batches ({rows} rows): {sent} delivered, {len(dead)} refused, {len(spool)} left")
        reasons = spool.dead_dir / "reasons.jsonl"
        if reasons.exists():
            print(reasons.read_text(), end="")
        return 0 if sent == total and not dead and len(spool) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
