"""In-process cost of the collector's own write path on the ingest bench's bodies: decode and
check of one 80-row packed body (min of 7 repeats, us), and ``write_batches`` per row in group
commits of 50 batches into a scratch PostgreSQL database (median of the steady groups, us).
No HTTP, no ASGI wrappers: what the collector/storage code costs, to set beside the end-to-end
``run.py``. Run:  .venv/bin/python bench/ingest/write_path_micro.py [--pg-admin URL]"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import timeit
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import run as bench  # noqa: E402  (the ingest bench's templates)
from pgscratch import scratch_database  # noqa: E402

from gpufleet import protocol  # noqa: E402
from gpufleet.collector.fastdecode import decode_prepared  # noqa: E402
from gpufleet.collector.validate import check_batch  # noqa: E402
from gpufleet.storage import retention  # noqa: E402
from gpufleet.storage.db import make_engine  # noqa: E402
from gpufleet.storage.migrate import upgrade  # noqa: E402
from gpufleet.storage.writes import WriteCache, write_batches  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pg-admin", default="postgresql://postgres@127.0.0.1:5432/postgres")
    a = ap.parse_args()
    now = time.time()
    tpl = bench.Templates(500, now, windows=12)
    bodies = []
    for k, b in enumerate(tpl.batches):
        b.agent.boot_id = f"micro-{k:06d}"
        bodies.append(protocol.encode(b, compress=None)[0])
    one = bodies[3]
    prep = decode_prepared(one, protocol.MSGPACK)
    assert prep is not None

    def us(f: object) -> float:
        return min(timeit.repeat(f, number=3000, repeat=7)) / 3000 * 1e6  # type: ignore[arg-type]

    print(f"decode_prepared: {us(lambda: decode_prepared(one, protocol.MSGPACK)):.1f} us per 80-row body")
    print(f"check_batch:     {us(lambda: check_batch(prep.batch, prep, now, max_rows=20_000, max_age_s=30 * 86400, max_future_s=300, dims_checked=True)):.1f} us")  # noqa: E501
    preps = [decode_prepared(b, protocol.MSGPACK) for b in bodies]
    with scratch_database(a.pg_admin, f"gpufleet_micro_{os.getpid()}") as url:
        upgrade(url)
        e = make_engine(url)
        retention.ensure_partitions(e, retention.days_of(np.array([now - 3600, now])))
        cache = WriteCache()
        per_row = []
        for i in range(0, len(preps), 50):
            grp = preps[i:i + 50]
            t0 = time.perf_counter()
            with e.begin() as c:
                write_batches(c, grp, time.time(), cache)
            per_row.append((time.perf_counter() - t0) / (len(grp) * tpl.rows_per_batch) * 1e6)
        e.dispose()
    steady = per_row[len(per_row) // 3:]
    print(f"write_batches:   {statistics.median(steady):.2f} us per row "
          f"(groups of 50 batches, median of {len(steady)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
