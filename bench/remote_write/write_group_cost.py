#!/usr/bin/env python
"""What a remote-write body costs the write path as a function of how many bodies one
transaction holds: client (collector) CPU and PostgreSQL backend CPU per body.

A remote-write body carries one sample per GPU (a scrape of ~10 nodes), so each GPU-minute's
rollup, minute-feature and raw-block rows are upserted once per scrape unless a transaction
holds several scrapes of the same GPUs. With ``--groups 10,40`` on the bench's 100 nodes (a
scrape of every GPU is 12 bodies): 10 bodies per transaction hold less than one scrape, 40 over
three. docs/prometheus.md ("What 1x would take") quotes it.

The bodies are bench/remote_write/run.py's, parsed by the receiver (``Receiver._parse``, warm
series cache), then written with ``storage.writes.write_batches`` into a fresh database per
group size (migrated, its dimensions created by a first write that is not timed). PostgreSQL's
CPU is the backend's own (/proc/<pid>/stat), so the server must run on this machine.
``--shuffle N`` shuffles the bodies within runs of N (as N concurrent connections deliver them:
late rows then read stored blocks back).

Run:  .venv/bin/python bench/remote_write/write_group_cost.py --admin postgresql://postgres@127.0.0.1:5432/postgres
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))
import receive_micro as rm  # (this directory: the bench's bodies)
from pg_instance import process_cpu_s  # (bench/: the /proc readers)

from gpufleet.collector.remote_write.receiver import Receiver
from gpufleet.pod_jobs import DEFAULT_PATTERNS
from gpufleet.storage.db import make_engine
from gpufleet.storage.migrate import upgrade
from gpufleet.storage.writes import WriteCache, write_batches


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--admin", required=True, help="a PostgreSQL URL on this machine allowed to CREATE DATABASE")
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--windows", type=int, default=34, help="scrapes of every node (the first 2 warm the caches)")
    ap.add_argument("--groups", default="10,40", help="bodies per transaction, each measured")
    ap.add_argument("--shuffle", type=int, default=0, help="shuffle the bodies within runs of this many")
    args = ap.parse_args()

    now = time.time()
    every = rm.bodies(args.nodes, args.windows, now)
    per_scrape = -(-args.nodes * 8 * len(rm.rw_bench.DCGM_FIELDS) // rm.rw_bench.SAMPLES_PER_SEND)
    warm, todo = every[:2 * per_scrape], every[2 * per_scrape:]
    if args.shuffle:
        rnd = random.Random(1)
        runs = [todo[i:i + args.shuffle] for i in range(0, len(todo), args.shuffle)]
        for r in runs:
            rnd.shuffle(r)
        todo = [b for r in runs for b in r]
    coll = SimpleNamespace(config=SimpleNamespace(max_age_s=30 * 86400.0, max_future_s=300.0,
                                                  kubernetes_job_patterns=DEFAULT_PATTERNS),
                           settings=SimpleNamespace(http=SimpleNamespace(max_rows_per_batch=20_000)))
    admin = make_engine(args.admin, isolation_level="AUTOCOMMIT")
    print(f"{len(todo)} bodies of {rm.rw_bench.SAMPLES_PER_SEND} samples ({args.nodes} nodes, "
          f"{per_scrape} bodies a scrape), shuffle {args.shuffle or 'none'}")
    for group in [int(x) for x in args.groups.split(",")]:
        rec = Receiver(coll)
        for b in warm:
            c = rec._parse(b, "bench", 64 << 20)
            assert not isinstance(c, tuple), c
            rec.rates.commit(c.rate_updates)
        convs = []
        for b in todo:
            c = rec._parse(b, "bench", 64 << 20)
            assert not isinstance(c, tuple), c
            rec.rates.commit(c.rate_updates)
            convs.append(c)
        name = f"gf_wgc_{os.getpid()}_{group}"
        with admin.connect() as a:
            a.exec_driver_sql(f"CREATE DATABASE {name}")
        try:
            url = f"{args.admin.rsplit('/', 1)[0]}/{name}"
            upgrade(url)
            engine = make_engine(url, pool_size=1)
            cache = WriteCache()
            with engine.begin() as conn:  # dimensions, once (as in a running collector)
                write_batches(conn, list(convs[0].prepared), now, cache)
                pid = int(conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())
            c0, p0, w0 = time.process_time(), process_cpu_s(pid), time.perf_counter()
            for i in range(1, len(convs), group):
                with engine.begin() as conn:
                    write_batches(conn, [p for c in convs[i:i + group] for p in c.prepared], now, cache)
            n = len(convs) - 1
            client, server = time.process_time() - c0, process_cpu_s(pid) - p0
            print(f"  {group:4d} bodies per transaction: client {client / n * 1e3:.3f} ms, PostgreSQL "
                  f"{server / n * 1e3:.3f} ms CPU per body (wall {(time.perf_counter() - w0) / n * 1e3:.3f} ms)")
            engine.dispose()
        finally:
            with admin.connect() as a:
                a.exec_driver_sql(f"DROP DATABASE IF EXISTS {name}")
    admin.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
