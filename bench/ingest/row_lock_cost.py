"""What the (node, day) advisory locks (storage/row_locks.py) cost the steady native-agent path:
``write_batches`` of the ingest bench's 80-row batches (500 nodes x 8 GPUs, each node's windows
moving forward in time) into a scratch PostgreSQL database, with the lock step and without it
(``writes.lock_node_days`` swapped for a no-op: the tree before), alternating transaction by
transaction in one process, so both sides see the same load, caches and table sizes.

Per row, medians over the transactions of each side: wall (perf_counter), the client's CPU
(process_time), the PostgreSQL backend's CPU (its /proc/<pid>/schedstat; the server is on this
machine); and the lock statement alone (wall and client CPU around ``lock_node_days``) in the
locked transactions. ``--group 1``: one batch per transaction (an idle collector, one lock per
80 rows: the worst case per row); ``--group 50``: the micro bench's group commits.

Run:  .venv/bin/python bench/ingest/row_lock_cost.py [--group 1] [--windows 12] [--pg-admin URL]"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import run as bench  # noqa: E402  (the ingest bench's templates)
from pgscratch import scratch_database  # noqa: E402

import gpufleet.storage.writes as writes  # noqa: E402
from gpufleet import protocol  # noqa: E402
from gpufleet.collector.fastdecode import decode_prepared  # noqa: E402
from gpufleet.storage import retention  # noqa: E402
from gpufleet.storage.db import make_engine  # noqa: E402
from gpufleet.storage.migrate import upgrade  # noqa: E402
from gpufleet.storage.row_locks import lock_node_days  # noqa: E402


def _backend_cpu_ns(pid: int) -> int:
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pg-admin", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--windows", type=int, default=12, help="10-s windows per node (500 nodes)")
    ap.add_argument("--group", type=int, default=1, help="batches per transaction")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    now = time.time()
    tpl = bench.Templates(500, now, windows=a.windows)
    preps = []
    for k, b in enumerate(tpl.batches):
        b.agent.boot_id = f"lock-{k:06d}"
        p = decode_prepared(protocol.encode(b, compress=None)[0], protocol.MSGPACK)
        assert p is not None
        preps.append(p)
    lock_s: list[tuple[float, float]] = []  # (wall, cpu) of the lock step, locked transactions

    def timed_lock(*args: Any) -> int:
        t0, c0 = time.perf_counter(), time.process_time()
        n = lock_node_days(*args)
        lock_s.append((time.perf_counter() - t0, time.process_time() - c0))
        return n

    sides: dict[str, list[tuple[int, float, float, int]]] = {"locked": [], "unlocked": []}
    with scratch_database(a.pg_admin, f"gpufleet_lockcost_{os.getpid()}") as url:
        upgrade(url)
        e = make_engine(url)
        retention.ensure_partitions(e, retention.days_of(np.array([now - 3600, now])))
        cache = writes.WriteCache()
        with e.connect() as c:
            pid = int(c.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())
            c.commit()
            for t, i in enumerate(range(0, len(preps), a.group)):
                grp = preps[i:i + a.group]
                side = "locked" if t % 2 == 0 else "unlocked"
                writes.lock_node_days = timed_lock if side == "locked" else (lambda *_: 0)  # type: ignore[assignment]
                b0 = _backend_cpu_ns(pid)
                t0, p0 = time.perf_counter(), time.process_time()
                with c.begin():
                    writes.write_batches(c, grp, time.time(), cache)
                t1, p1 = time.perf_counter(), time.process_time()
                b1 = _backend_cpu_ns(pid)
                sides[side].append((sum(p.n for p in grp), t1 - t0, p1 - p0, b1 - b0))
        e.dispose()
    out: dict[str, Any] = {"group": a.group, "transactions": len(sides["locked"]) + len(sides["unlocked"])}
    for side, groups in sides.items():
        steady = groups[len(groups) // 3:]  # the first third creates the rows the rest fold into
        out[side] = {
            "wall_us_row": statistics.median(g[1] / g[0] * 1e6 for g in steady),
            "client_cpu_us_row": statistics.median(g[2] / g[0] * 1e6 for g in steady),
            "backend_cpu_us_row": statistics.median(g[3] / g[0] / 1e3 for g in steady),
        }
    rows = a.group * tpl.rows_per_batch
    steady_lock = lock_s[len(lock_s) // 3:]
    out["lock_step_wall_us_row"] = statistics.median(w for w, _ in steady_lock) / rows * 1e6
    out["lock_step_cpu_us_row"] = statistics.median(c for _, c in steady_lock) / rows * 1e6
    if a.json:
        print(json.dumps(out))
        return 0
    print(f"write_batches, {a.group} batch(es) of {tpl.rows_per_batch} rows per transaction, "
          f"{out['transactions']} transactions alternating, medians of the steady two thirds, us per row:")
    for side in ("unlocked", "locked"):
        s = out[side]
        print(f"  {side:9s} wall {s['wall_us_row']:.2f}  client CPU {s['client_cpu_us_row']:.2f}  "
              f"PostgreSQL CPU {s['backend_cpu_us_row']:.2f}")
    print(f"  the lock step alone: wall {out['lock_step_wall_us_row']:.3f}  "
          f"client CPU {out['lock_step_cpu_us_row']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
