"""In-process cost of the collector's own write path on the ingest bench's bodies: decode and
check of one 80-row packed body (min of 7 repeats, us), and ``write_batches`` in group commits
of 50 batches into a scratch PostgreSQL database: per row, the wall time, the client's CPU
(``time.process_time``), the PostgreSQL backend's CPU (its ``/proc/<pid>/schedstat``, read
around each group: the server is on this machine) and the WAL written
(``pg_current_wal_lsn`` before and after), over the steady groups (the first third warm the
caches and create the rows later groups fold into). CPU and WAL resist a loaded machine; wall
does not. No HTTP, no ASGI wrappers: what the collector/storage code and PostgreSQL cost,
to set beside the end-to-end ``run.py``.

Run:  .venv/bin/python bench/ingest/write_path_micro.py [--pg-admin URL] [--windows 12]
A/B:  put the tree before first on PYTHONPATH (docs/benchmarks.md, "the tree before, as an
importable package") and run the same command; interleave the two.
--split: every batch as two, each with half of the catalog's fields (a remote-write sender's
two shards), under two batch keys; the first halves of 50 batches are one group commit, their
second halves the next (each row's second half meets the stored first: the supplement path)."""

from __future__ import annotations

import argparse
import json
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

# gpufleet first, from PYTHONPATH when one is set (an A/B's old tree): run.py puts this
# checkout first on sys.path, but submodules are found through the package already imported.
import gpufleet  # noqa: E402, F401, I001
import run as bench  # noqa: E402  (the ingest bench's templates)
from pgscratch import scratch_database  # noqa: E402

from gpufleet import protocol  # noqa: E402
from gpufleet.collector.fastdecode import decode_prepared  # noqa: E402
from gpufleet.collector.validate import check_batch  # noqa: E402
from gpufleet.storage import retention  # noqa: E402
from gpufleet.storage.db import make_engine  # noqa: E402
from gpufleet.storage.migrate import upgrade  # noqa: E402
from gpufleet.storage.writes import WriteCache, write_batches  # noqa: E402

# Tables whose update counts are reported (HOT = no new index entries).
_UPDATED = ("gpu_samples_1m", "job_samples_1m", "gpu_minute_features", "job_hist_features")


def _backend_cpu_ns(pid: int) -> int:
    """Nanoseconds the backend ``pid`` has run on a CPU (schedstat: ns, not 10 ms ticks)."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


def _wal_lsn(c: object) -> int:
    lsn = c.exec_driver_sql("SELECT pg_current_wal_lsn()::text").scalar()  # type: ignore[attr-defined]
    hi, lo = lsn.split("/")
    return (int(hi, 16) << 32) + int(lo, 16)


def _split(preps: list) -> list:  # type: ignore[type-arg]
    """Each group of 50 batches as 50 first halves (fields 0..NF/2) then 50 second halves."""
    import copy

    out = []
    for i in range(0, len(preps), 50):
        grp = preps[i:i + 50]
        for half in (0, 1):
            for p in grp:
                q = copy.copy(p)
                q.batch = copy.copy(p.batch)
                q.batch.agent = copy.copy(p.batch.agent)
                q.batch.agent.boot_id = f"{p.batch.agent.boot_id}-{half}"
                v = p.vals.copy()
                mid = len(v) // 2
                v[mid:] = np.nan if half == 0 else v[mid:]
                v[:mid] = np.nan if half == 1 else v[:mid]
                q.vals = v
                out.append(q)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pg-admin", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--windows", type=int, default=12, help="10-s windows per node (500 nodes, 8 GPUs each)")
    ap.add_argument("--skip-decode", action="store_true", help="only the write path")
    ap.add_argument("--json", action="store_true", help="one JSON line instead of text")
    ap.add_argument("--split", action="store_true", help="each batch's fields in two batches (two shards)")
    a = ap.parse_args()
    now = time.time()
    tpl = bench.Templates(500, now, windows=a.windows)
    bodies = []
    for k, b in enumerate(tpl.batches):
        b.agent.boot_id = f"micro-{k:06d}"
        bodies.append(protocol.encode(b, compress=None)[0])
    one = bodies[3]
    prep = decode_prepared(one, protocol.MSGPACK)
    assert prep is not None
    out: dict[str, float] = {}

    def us(f: object) -> float:
        return min(timeit.repeat(f, number=3000, repeat=7)) / 3000 * 1e6  # type: ignore[arg-type]

    if not a.skip_decode:
        out["decode_us"] = us(lambda: decode_prepared(one, protocol.MSGPACK))
        out["check_us"] = us(lambda: check_batch(prep.batch, prep, now, max_rows=20_000, max_age_s=30 * 86400,
                                                 max_future_s=300, dims_checked=True))
    preps = [decode_prepared(b, protocol.MSGPACK) for b in bodies]
    if a.split:
        preps = _split(preps)
    with scratch_database(a.pg_admin, f"gpufleet_micro_{os.getpid()}") as url:
        upgrade(url)
        e = make_engine(url)
        retention.ensure_partitions(e, retention.days_of(np.array([now - 3600, now])))
        cache = WriteCache()
        groups = []  # (rows, wall s, client cpu s, backend cpu ns, wal bytes)
        with e.connect() as c:  # one connection, so one backend to read
            pid = int(c.exec_driver_sql("SELECT pg_backend_pid()").scalar())  # type: ignore[arg-type]
            c.commit()
            for i in range(0, len(preps), 50):
                grp = preps[i:i + 50]
                lsn0, b0 = _wal_lsn(c), _backend_cpu_ns(pid)
                c.commit()
                t0, p0 = time.perf_counter(), time.process_time()
                with c.begin():
                    write_batches(c, grp, time.time(), cache)
                t1, p1 = time.perf_counter(), time.process_time()
                b1 = _backend_cpu_ns(pid)
                lsn1 = _wal_lsn(c)
                c.commit()
                groups.append((len(grp) * tpl.rows_per_batch, t1 - t0, p1 - p0, b1 - b0, lsn1 - lsn0))
            c.exec_driver_sql("SELECT pg_stat_force_next_flush()")
            c.commit()
        e.dispose()
        e = make_engine(url)
        with e.connect() as c:
            stats = c.exec_driver_sql(
                "SELECT relname, sum(n_tup_upd), sum(n_tup_hot_upd) FROM pg_stat_user_tables "
                "WHERE relname LIKE ANY (%(p)s) GROUP BY 1 ORDER BY 1",
                {"p": [f"{t}%" for t in _UPDATED]}).fetchall()
        e.dispose()
    steady = groups[len(groups) // 3:]
    rows = sum(g[0] for g in steady)
    out["wall_us_row_median"] = statistics.median(g[1] / g[0] * 1e6 for g in steady)
    out["client_cpu_us_row"] = sum(g[2] for g in steady) / rows * 1e6
    out["backend_cpu_us_row"] = sum(g[3] for g in steady) / rows / 1e3
    out["wal_bytes_per_gpu_sample"] = sum(g[4] for g in steady) / rows
    # Medians of the groups too: a loaded machine inflates some groups' CPU (cache and core
    # sharing), and the median shrugs those off where the sum does not.
    out["client_cpu_us_row_median"] = statistics.median(g[2] / g[0] * 1e6 for g in steady)
    out["backend_cpu_us_row_median"] = statistics.median(g[3] / g[0] / 1e3 for g in steady)
    hot: dict[str, tuple[int, int]] = {}
    for name, upd, hupd in stats:
        base = next(t for t in _UPDATED if name.startswith(t))
        u, h = hot.get(base, (0, 0))
        hot[base] = (u + int(upd or 0), h + int(hupd or 0))
    if a.json:
        import gpufleet.storage.writes as tree  # which tree ran (an A/B's old side is on PYTHONPATH)

        print(json.dumps({**out, "hot": hot, "groups": len(steady), "tree": tree.__file__}))
        return 0
    if "decode_us" in out:
        print(f"decode_prepared: {out['decode_us']:.1f} us per 80-row body")
        print(f"check_batch:     {out['check_us']:.1f} us")
    print(f"write_batches, groups of 50 batches, {len(steady)} steady groups:")
    print(f"  wall (median)    {out['wall_us_row_median']:.2f} us per row")
    print(f"  client CPU       {out['client_cpu_us_row']:.2f} us per row "
          f"(median of the groups {out['client_cpu_us_row_median']:.2f})")
    print(f"  PostgreSQL CPU   {out['backend_cpu_us_row']:.2f} us per row "
          f"(median {out['backend_cpu_us_row_median']:.2f}; the backend's schedstat)")
    print(f"  WAL              {out['wal_bytes_per_gpu_sample']:.0f} B per GPU-sample")
    for t, (u, h) in hot.items():
        print(f"  {t}: {u} updates, {h} HOT ({h / max(u, 1):.0%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
