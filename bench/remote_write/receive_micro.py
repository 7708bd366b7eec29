#!/usr/bin/env python
"""Where one remote-write request's CPU goes, in-process and without HTTP or wrk noise: the
bench's own bodies (bench/remote_write/run.py: ~2,000 dcgm-exporter series x 1 sample) through
the receiver's stages one by one, each timed as the minimum of --repeat runs on a warm series
cache (what a Prometheus shard's steady state is):

  snappy   wire.unsnappy
  decode   wire.decode with the series cache's known label encodings
  convert  mapping.convert: series -> per-node batches (rows per (GPU, ts), counters -> rates)
  prepare  columns.prepare + validate.check_batch of each batch (what the receiver's _parse does)
  write    storage.writes.write_batches of all the body's batches in one transaction (SQLite,
           or --db URL), fresh batch keys each run so nothing is a duplicate

and, the A/B figure (run it with the old tree first on PYTHONPATH for the before), the
receiver's whole per-request CPU before the write: ``Receiver._parse`` (snappy, digest, the
columnar scan and conversion, checks) over distinct bodies in send order, CPU time per body,
the median of --repeat passes.

Run:  .venv/bin/python bench/remote_write/receive_micro.py [--nodes 50] [--repeat 20] [--db URL]

The in-process A/B (old and new code in one process, alternating; ``ab`` below):
      git worktree add /tmp/rw-old HEAD~1
      .venv/bin/python bench/remote_write/receive_micro.py --ab /tmp/rw-old [--repeat 9] [--db URL]
(--db: a PostgreSQL server URL; each pass writes into a database of its own, created and dropped.)
"""

from __future__ import annotations

import argparse
import hashlib
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# isort: off
# gpufleet before run.py: bench/ingest/run.py (which it loads) puts this repo first on sys.path,
# and an older tree given first on PYTHONPATH (the A/B "before") must stay the one measured
import gpufleet.collector.remote_write.receiver  # noqa: F401
import run as rw_bench  # bench/remote_write/run.py (this directory is on sys.path when run as a script)
# isort: on

from gpufleet.collector.columns import prepare
from gpufleet.collector.remote_write import wire
from gpufleet.collector.remote_write.columnar import Slots, convert_columnar
from gpufleet.collector.remote_write.mapping import Conversion, RateState, SeriesMap, convert
from gpufleet.collector.validate import check_batch
from gpufleet.pod_jobs import DEFAULT_PATTERNS


def bodies(nodes: int, windows: int, now: float) -> list[bytes]:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "bodies.bin"
        rw_bench.remote_write_bodies(path, nodes, windows, now)
        data = path.read_bytes()
    out, pos = [], 0
    while pos < len(data):
        n = int(data[pos:pos + 10])
        out.append(data[pos + 10:pos + 10 + n])
        pos += 10 + n
    return out


def best(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    times, res = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        res = fn()
        times.append(time.perf_counter() - t)
    return min(times), res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=50)
    ap.add_argument("--windows", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--db", help="database URL for the write stage (default: a throwaway SQLite file)")
    ap.add_argument("--skip-write", action="store_true")
    args = ap.parse_args()

    now = time.time()
    all_bodies = bodies(args.nodes, args.windows, now)
    body = all_bodies[len(all_bodies) // 2]
    series, rates = SeriesMap(), RateState()
    limit = 64 << 20
    # warm the series cache and the counters' previous samples on every body, as a running shard has
    for b in all_bodies:
        c = convert(wire.decode(wire.unsnappy(b, max_size=limit)), series, rates, cluster="bench", digest="warm",
                    now=now, max_age_s=None, max_future_s=300, max_rows=20_000)
        rates.commit(c.rate_updates)
    raw = wire.unsnappy(body, max_size=limit)
    req = wire.decode(raw, series.known)
    stages: dict[str, float] = {}
    stages["snappy"], _ = best(lambda: wire.unsnappy(body, max_size=limit), args.repeat)
    stages["decode"], _ = best(lambda: wire.decode(raw, series.known), args.repeat)
    stages["digest"], _ = best(lambda: hashlib.blake2b(body, digest_size=12, person=b"gpufleet-rw",
                                                       key=b"bench").hexdigest(), args.repeat)
    t_raw_digest, _ = best(lambda: hashlib.blake2b(raw, digest_size=12, person=b"gpufleet-rw",
                                                   key=b"bench").hexdigest(), args.repeat)

    def conv(digest: str = "d") -> Conversion:
        return convert(req, series, rates, cluster="bench", digest=digest, now=now, max_age_s=None,
                       max_future_s=300, max_rows=20_000)

    stages["convert"], cv = best(conv, args.repeat)

    def prep(c: Conversion) -> list[Any]:
        out = []
        for b in c.batches:
            p = prepare(b)
            check_batch(b, p, now, max_rows=20_000, max_age_s=None, max_future_s=300)
            out.append(p)
        return out

    stages["prepare"], preps = best(lambda: prep(cv), args.repeat)
    # the receiver's path for such a body: the columnar scan + conversion instead of the three above
    slots = Slots()
    convert_columnar(wire.scan_single_samples(raw, None), series, slots, rates,  # type: ignore[arg-type]
                     cluster="bench", digest="d", now=now, max_age_s=None, max_future_s=300, max_rows=20_000)

    def columnar() -> Conversion | None:
        cols = wire.scan_single_samples(raw, None)
        assert cols is not None, "the bench's body should take the columnar path"
        c = convert_columnar(cols, series, slots, rates, cluster="bench", digest="d", now=now, max_age_s=None,
                             max_future_s=300, max_rows=20_000)
        assert c is not None
        for b, p in zip(c.batches, c.prepared, strict=True):
            check_batch(b, p, now, max_rows=20_000, max_age_s=None, max_future_s=300)
        return c

    t_col, ccv = best(columnar, args.repeat)
    if not args.skip_write:
        from gpufleet.storage.db import make_engine
        from gpufleet.storage.writes import WriteCache, write_batches

        with tempfile.TemporaryDirectory() as d:
            url = args.db
            if url is None:
                from gpufleet.storage.migrate import upgrade

                url = f"sqlite:///{Path(d) / 'micro.db'}"
                upgrade(url)
            engine = make_engine(url)
            cache = WriteCache()
            k = [0]

            def write() -> None:
                k[0] += 1
                ps = prep(conv(f"w{k[0]}"))
                with engine.begin() as c:
                    write_batches(c, ps, now, cache)

            write()  # dimensions (cluster, nodes, GPUs, jobs) created once, as in a running collector
            t_with_prep, _ = best(write, max(3, args.repeat // 4))
            stages["write"] = t_with_prep - stages["convert"] - stages["prepare"]
            engine.dispose()
    rows = sum(p.n for p in preps)
    print(f"body: {len(body):,} bytes snappy, {len(raw):,} raw, {len(req.series):,} series, "
          f"{len(cv.batches)} batches, {rows} rows; min of {args.repeat}")
    for name, t in stages.items():
        print(f"  {name:8s} {t * 1e3:8.3f} ms")
    total = sum(stages.values())
    print(f"  {'total':8s} {total * 1e3:8.3f} ms  ({len(req.series) / total:,.0f} samples/s on one core)")
    col_total = total - stages["decode"] - stages["convert"] - stages["prepare"] + t_col
    assert ccv is not None and sum(p.n for p in ccv.prepared) == rows
    print(f"digest of the decompressed body (the key before session 3): {t_raw_digest * 1e3:.3f} ms")
    print(f"columnar (scan + convert_columnar + check_batch, replacing decode/convert/prepare): {t_col * 1e3:.3f} ms;"
          f" total {col_total * 1e3:.3f} ms ({len(req.series) / col_total:,.0f} samples/s on one core)")


def receiver_parse(nodes: int, windows: int, repeat: int) -> None:
    """CPU per request of ``Receiver._parse`` on the bench's bodies, as a running collector
    sees them: a warm series cache (the first scrapes), then the later scrapes in send order."""
    import statistics
    from types import SimpleNamespace

    from gpufleet.collector.remote_write.receiver import Receiver

    _measurable(windows)
    now = time.time()
    all_bodies = bodies(nodes, windows, now)
    per_scrape = -(-nodes * 8 * len(rw_bench.DCGM_FIELDS) // rw_bench.SAMPLES_PER_SEND)
    coll = SimpleNamespace(config=SimpleNamespace(max_age_s=30 * 86400.0, max_future_s=300.0,
                                                  kubernetes_job_patterns=DEFAULT_PATTERNS),
                           settings=SimpleNamespace(http=SimpleNamespace(max_rows_per_batch=20_000)))
    passes = []
    for _ in range(repeat):
        rec = Receiver(coll)
        for b in all_bodies[:2 * per_scrape]:  # the series cache and the counters' previous samples
            c = rec._parse(b, "bench", 64 << 20)
            assert not isinstance(c, tuple), c
            rec.rates.commit(c.rate_updates)
        todo = all_bodies[2 * per_scrape:]
        t = time.process_time()
        for b in todo:
            c = rec._parse(b, "bench", 64 << 20)
            assert not isinstance(c, tuple), c
            rec.rates.commit(c.rate_updates)
        passes.append((time.process_time() - t) / len(todo))
    med = statistics.median(passes)
    import gpufleet.collector.remote_write.receiver as mod

    print(f"({mod.__file__})")
    print(f"Receiver._parse: {med * 1e3:.3f} ms CPU per {rw_bench.SAMPLES_PER_SEND}-sample body (median of {repeat} "
          f"passes over {len(all_bodies) - 2 * per_scrape} bodies; min {min(passes) * 1e3:.3f})")


def _old_package(tree: Path) -> Any:
    """``tree``'s collector/remote_write loaded as package ``rw_old`` beside the current one (its
    relative imports stay inside it; gpufleet.* is this tree's), so old and new run in one process."""
    import importlib.util
    import sys

    d = tree / "collector" / "remote_write"
    spec = importlib.util.spec_from_file_location("rw_old", d / "__init__.py", submodule_search_locations=[str(d)])
    assert spec is not None and spec.loader is not None
    pkg = importlib.util.module_from_spec(spec)
    sys.modules["rw_old"] = pkg
    spec.loader.exec_module(pkg)
    importlib.import_module("rw_old.receiver")
    return pkg


def in_flight(rec: Any, todo: list[bytes], limit: int, conns: int = 64) -> float:
    """CPU per body of ``rec._parse`` with ``conns`` requests in flight, dispatched the way the
    receiver's ``_handle`` does: on its own parse thread (``_parser``), or, in a tree from
    before it had one, on Starlette's threadpool (anyio's, 40 threads)."""
    import asyncio

    from starlette.concurrency import run_in_threadpool

    async def run() -> float:
        sem = asyncio.Semaphore(conns)
        loop = asyncio.get_running_loop()
        parser = getattr(rec, "_parser", None)

        async def one(b: bytes) -> None:
            async with sem:
                if parser is not None:
                    c = await loop.run_in_executor(parser, rec._parse, b, "bench", limit)
                else:
                    c = await run_in_threadpool(rec._parse, b, "bench", limit)
                with rec._lock:
                    rec.rates.commit(c.rate_updates)

        t = time.process_time()
        await asyncio.gather(*(one(b) for b in todo))
        return (time.process_time() - t) / len(todo)

    return asyncio.run(run())


def ab(old_tree: Path, nodes: int, windows: int, repeat: int, db: str | None, group: int) -> None:
    """Collector CPU per body, old tree vs this one in one process, passes alternating, the fastest
    of ``repeat`` each (``time.process_time``): the receiver's whole ``_parse`` (one body after the
    other, and ``_parse@64``: 64 in flight, as the receiver dispatches them), its split into
    parse (snappy + the columnar scan) and convert (convert_columnar + check_batch), and the write
    (``write_batches`` of ``group`` bodies' batches per transaction, as the group writer commits
    them; a fresh database per pass so no row is a repeat)."""
    from types import SimpleNamespace

    import gpufleet.collector.remote_write as new_pkg
    from gpufleet.storage.db import make_engine
    from gpufleet.storage.migrate import upgrade
    from gpufleet.storage.writes import WriteCache, write_batches

    _measurable(windows)
    pkgs = {"old": _old_package(old_tree), "new": new_pkg}
    now = time.time()
    all_bodies = bodies(nodes, windows, now)
    per_scrape = -(-nodes * 8 * len(rw_bench.DCGM_FIELDS) // rw_bench.SAMPLES_PER_SEND)
    warm, todo = all_bodies[:2 * per_scrape], all_bodies[2 * per_scrape:]
    coll = SimpleNamespace(config=SimpleNamespace(max_age_s=30 * 86400.0, max_future_s=300.0,
                                                  kubernetes_job_patterns=DEFAULT_PATTERNS),
                           settings=SimpleNamespace(http=SimpleNamespace(max_rows_per_batch=20_000)))
    limit = 64 << 20
    best_of: dict[tuple[str, str], float] = {}
    shape: dict[str, tuple[int, int]] = {}

    def keep(who: str, what: str, t: float) -> None:
        best_of[who, what] = min(best_of.get((who, what), t), t)

    def one_pass(who: str, d: Path, k: int) -> None:
        pkg = pkgs[who]
        rec = pkg.receiver.Receiver(coll)
        for b in warm:  # the series cache and the counters' previous samples, as a running shard has
            c = rec._parse(b, "bench", limit)
            assert not isinstance(c, tuple), c
            rec.rates.commit(c.rate_updates)
        t = time.process_time()
        for b in todo:  # (not kept: 66 conversions alive at once would time the GC, not the receiver)
            c = rec._parse(b, "bench", limit)
            rec.rates.commit(c.rate_updates)
            assert c.columnar, "the bench's bodies should take the columnar path"
        keep(who, "_parse", (time.process_time() - t) / len(todo))
        keep(who, "_parse@64", in_flight(rec, todo, limit))
        # the split, on the same bodies and warm state (the answers are the same: rates do not move)
        raws = []
        t = time.process_time()
        for b in todo:
            raw = pkg.wire.unsnappy(b, max_size=limit)
            raws.append((raw, pkg.wire.scan_single_samples(raw, None)))
        keep(who, "parse", (time.process_time() - t) / len(todo))
        convs = []
        t = time.process_time()
        for i, (_raw, cols) in enumerate(raws):
            c = pkg.columnar.convert_columnar(cols, rec.series, rec.slots, rec.rates, cluster="bench",
                                              digest=f"d{k}-{i}", now=now, max_age_s=30 * 86400.0,
                                              max_future_s=300.0, max_rows=20_000)
            for bt, p in zip(c.batches, c.prepared, strict=True):
                check_batch(bt, p, now, max_rows=20_000, max_age_s=30 * 86400.0, max_future_s=300.0)
            convs.append(c)
        keep(who, "convert", (time.process_time() - t) / len(todo))
        shape[who] = (sum(len(c.prepared) for c in convs), sum(p.n for c in convs for p in c.prepared))
        if db is None:
            url = f"sqlite:///{d / f'{who}{k}.db'}"
        else:  # a database per pass: the same rows again would be skipped as already stored
            url = f"{db.rsplit('/', 1)[0]}/rw_micro_{os.getpid()}_{who}{k}"
            with admin.connect() as c:
                c.exec_driver_sql(f"CREATE DATABASE rw_micro_{os.getpid()}_{who}{k}")
            made.append(f"rw_micro_{os.getpid()}_{who}{k}")
        upgrade(url)
        engine = make_engine(url)
        cache = WriteCache()
        with engine.begin() as conn:  # dimensions (cluster, nodes, GPUs) created once
            write_batches(conn, [p for c in convs[:1] for p in c.prepared], now, cache)
        t = time.process_time()
        for i in range(1, len(convs), group):
            with engine.begin() as conn:
                write_batches(conn, [p for c in convs[i:i + group] for p in c.prepared], now, cache)
        keep(who, "write", (time.process_time() - t) / (len(convs) - 1))
        engine.dispose()

    admin = make_engine(db, isolation_level="AUTOCOMMIT") if db is not None else None
    made: list[str] = []
    try:
        with tempfile.TemporaryDirectory() as d:
            for k in range(repeat):
                for who in ("old", "new") if k % 2 == 0 else ("new", "old"):
                    one_pass(who, Path(d), k)
    finally:
        if admin is not None:
            with admin.connect() as c:
                for name in made:
                    c.exec_driver_sql(f"DROP DATABASE IF EXISTS {name}")
            admin.dispose()
    print(f"{len(todo)} bodies of {rw_bench.SAMPLES_PER_SEND} samples ({nodes} nodes x 8 GPUs x "
          f"{len(rw_bench.DCGM_FIELDS)} fields, {windows} scrapes), CPU ms per body, fastest of {repeat} "
          f"alternating passes; write: {group} bodies per transaction on {'SQLite' if db is None else db}")
    for who in ("old", "new"):
        print(f"  {who}: {shape[who][0] / len(todo):.1f} batches, {shape[who][1] / len(todo):.1f} rows per body")
    print(f"  {'':10s} {'old':>8s} {'new':>8s}  old/new")
    for what in ("_parse", "_parse@64", "parse", "convert", "write"):
        o, n = best_of["old", what], best_of["new", what]
        print(f"  {what:10s} {o * 1e3:8.3f} {n * 1e3:8.3f}  {o / n:6.2f}x")
    o = best_of["old", "_parse"] + best_of["old", "write"]
    n = best_of["new", "_parse"] + best_of["new", "write"]
    print(f"  {'_parse+write':10s} {o * 1e3:8.3f} {n * 1e3:8.3f}  {o / n:6.2f}x")


def _measurable(windows: int) -> None:
    """The first two scrapes only warm the series cache and the counters: with no third one
    there is nothing to time (it divided by zero)."""
    if windows < 3:
        raise SystemExit(f"--windows {windows} leaves no body to measure (the first 2 scrapes warm the caches): "
                         "give 3 or more")


if __name__ == "__main__":
    import sys

    if "--ab" in sys.argv:  # old vs new in one process: --ab OLD_TREE [--db URL] [--repeat N] ...
        p = argparse.ArgumentParser()
        p.add_argument("--ab", type=Path, required=True, help="a checkout of the old code (git worktree add)")
        p.add_argument("--nodes", type=int, default=100)
        p.add_argument("--windows", type=int, default=8)
        p.add_argument("--repeat", type=int, default=5)
        p.add_argument("--group", type=int, default=10, help="bodies per write transaction")
        p.add_argument("--db", help="database URL for the write (default: a throwaway SQLite file per pass)")
        a = p.parse_args()
        ab(a.ab, a.nodes, a.windows, a.repeat, a.db, a.group)
    elif "--parse" in sys.argv:  # the A/B figure: [--parse NODES WINDOWS REPEAT]
        i = sys.argv.index("--parse")
        n, w, r = (int(x) for x in (sys.argv[i + 1:i + 4] + ["100", "8", "5"][len(sys.argv[i + 1:i + 4]):]))
        receiver_parse(n, w, r)
    else:
        main()
