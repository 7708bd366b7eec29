"""`gpufleet gpu move UUID --cluster C --node N`: give a GPU to another cluster's node. A GPU
uuid belongs to one cluster until an admin does this (another cluster reporting it is refused)."""

from __future__ import annotations

import argparse

from gpufleet.commands._db import add_database_args, database_url


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("gpu", help="admin operations on GPUs (move one to another cluster)")
    gsub = p.add_subparsers(dest="gpu_command", metavar="ACTION", required=True)
    m = gsub.add_parser("move", help="give a GPU to a node of another (or the same) cluster")
    m.add_argument("uuid")
    m.add_argument("--cluster", required=True, help="the cluster that owns the GPU from now on")
    m.add_argument("--node", required=True, help="the node of that cluster that reports it")
    add_database_args(m)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gpufleet.storage.db import make_engine
    from gpufleet.storage.scope import move_gpu

    engine = make_engine(database_url(args))
    try:
        moved = move_gpu(engine, args.uuid, args.cluster, args.node)
    finally:
        engine.dispose()
    if moved is None:
        print(f"gpufleet gpu move: no GPU with uuid {args.uuid!r}")
        return 1
    print(f"moved {moved.uuid}: {moved.from_cluster}/{moved.from_node} -> {moved.to_cluster}/{moved.to_node} "
          "(running collectors stop taking it from the old node within 10 minutes)")
    return 0
