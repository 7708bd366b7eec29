"""Two transactions writing pieces of the same (GPU, ts) rows at the same moment (a remote-write
sender's shards landing on two collector processes): every field stored once and folded once
into the rollups and minute features, exactly what one request with all the fields stores.

PostgreSQL only: SQLite has one writer at a time (the ledger insert, a write, comes before the
stored rows are read), so a second writer there reads what the first committed. The
interleaving is forced, not timed: A writes its piece and holds its transaction open; B starts
its write on a second connection in a thread; the test waits until PostgreSQL reports B blocked
by A (``pg_blocking_pids``), then commits A, then lets B finish and commit.

Each writer's ``WriteCache`` is warmed first, as a running collector process's is (node, GPUs,
job times), so the concurrent writes touch no shared dimension row: otherwise B would wait on
A's ``nodes``/``jobs`` row before reading the stored rows, and the race would not be exercised."""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from sqlalchemy import Engine

from gpufleet.catalog import CATALOG
from gpufleet.collector.columns import prepare
from gpufleet.protocol import Batch
from gpufleet.storage import row_locks
from gpufleet.storage.db import make_engine
from gpufleet.storage.write_cache import WriteCache
from gpufleet.storage.writes import WriteResult, write_batches
from tests.collector.conftest import gpu_uuid, make_batch
from tests.storage.test_field_merge import SECOND, _differences, _stored

NOW = time.time()
# :20 of a minute, 60 s: every piece spans a minute boundary.
MINUTE = (NOW // 600 - 3) * 600 + 440
# 30 s before the last UTC midnight: a minute and a day boundary (two lock keys per writer).
MIDNIGHT = (NOW // 86400) * 86400 - 30
FIRST = tuple(n for n in CATALOG.names if n not in SECOND)


@pytest.fixture
def e(pg_url: str) -> Iterator[Engine]:
    eng = make_engine(pg_url)
    yield eng
    eng.dispose()


def _batch(cluster: str, start: float, boot: str, *, seed: int = 7, seconds: int = 60) -> Batch:
    return make_batch(f"node-{cluster}", cluster=cluster, boot_id=boot, gpus=3, seconds=seconds, start=start,
                      seed=seed)


def _rows(b: Batch, gpus: set[int]) -> Batch:
    """``b`` with only the rows of GPUs ``gpus`` (every GPU still listed)."""
    p = copy.deepcopy(b)
    keep = {gpu_uuid(b.agent.node, g) for g in gpus}
    idx = [i for i, u in enumerate(b.samples["gpu"]) if u in keep]
    p.samples = {k: [v[i] for i in idx] for k, v in b.samples.items()}
    return p


def _fields(b: Batch, names: tuple[str, ...], boot: str) -> Batch:
    p = copy.deepcopy(b)
    p.agent.boot_id = boot
    p.samples = {k: v for k, v in p.samples.items() if k in ("ts", "gpu", "job") or k in names}
    return p


def _write(e: Engine, b: Batch, cache: WriteCache | None = None) -> WriteResult:
    with e.begin() as c:
        return write_batches(c, [prepare(b)], NOW, cache)


def _warm(e: Engine, cluster: str, start: float, caches: list[WriteCache]) -> None:
    """The minute before ``start`` for every GPU, and GPU 2 over the pieces' own span: each
    cache then knows the node, GPUs, allocations and the job's times up to the pieces' end."""
    before = _batch(cluster, start - 60, "w")
    during = _rows(_batch(cluster, start, "w"), {2})
    for k, cache in enumerate(caches or [WriteCache()]):
        for j, b in enumerate((before, during)):
            b = copy.deepcopy(b)
            b.agent.boot_id = f"{cluster}-warm-{k}-{j}"
            _write(e, b, cache)


def _main(cluster: str, start: float, seed: int = 7) -> Batch:
    """The rows the pieces carry: GPUs 0 and 1 over 60 s."""
    return _rows(_batch(cluster, start, f"{cluster}-main", seed=seed), {0, 1})


def _concurrently(e: Engine, first: Batch, second: Batch, cache_a: WriteCache, cache_b: WriteCache,
                  held: list[tuple[int, int]] | None = None) -> tuple[WriteResult, WriteResult]:
    """A writes ``first`` and holds its transaction; B writes ``second`` in a thread until
    PostgreSQL reports it blocked by A; A commits; B finishes and commits. ``held`` gets the
    two-int advisory keys A held meanwhile."""
    ca, cb = e.connect(), e.connect()
    try:
        pid_a = ca.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
        pid_b = cb.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
        ca.commit()
        cb.commit()
        out: dict[str, Any] = {}

        def run_b() -> None:
            try:
                with cb.begin():
                    out["b"] = write_batches(cb, [prepare(second)], NOW, cache_b)
            except BaseException as x:  # re-raised on the test's thread
                out["error"] = x

        ta = ca.begin()
        ra = write_batches(ca, [prepare(first)], NOW, cache_a)
        th = threading.Thread(target=run_b, daemon=True)
        th.start()
        blocked = False
        deadline = time.monotonic() + 60  # a hang guard only: the wait ends on B's lock wait
        with e.connect() as w:
            while th.is_alive() and time.monotonic() < deadline:
                blocked = bool(w.exec_driver_sql(
                    "SELECT %(a)s = ANY(pg_blocking_pids(%(b)s))", {"a": pid_a, "b": pid_b}).scalar_one())
                w.rollback()
                if blocked:
                    if held is not None:
                        held.extend(tuple(r) for r in w.exec_driver_sql(
                            "SELECT classid::int, objid::int FROM pg_locks WHERE locktype = 'advisory' "
                            "AND objsubid = 2 AND pid = %(a)s AND granted ORDER BY 1, 2", {"a": pid_a}).all())
                        w.rollback()
                    break
                time.sleep(0.005)
        ta.commit()
        th.join(60)
        assert not th.is_alive(), "B still running after A committed"
        if "error" in out:
            raise out["error"]
        assert blocked, "B never waited for A: the two writes did not overlap"
        return ra, out["b"]
    finally:
        ca.close()
        cb.close()


def _two_caches(e: Engine, cluster: str, start: float) -> tuple[WriteCache, WriteCache]:
    a, b = WriteCache(), WriteCache()
    _warm(e, cluster, start, [a, b])
    return a, b


@pytest.mark.parametrize("path", ["few-keys", "key-arrays"])
@pytest.mark.parametrize("start", [MINUTE, MIDNIGHT], ids=["minute-boundary", "day-boundary"])
def test_concurrent_pieces_of_a_row_store_and_fold_it_once(e: Engine, start: float, path: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    if path == "key-arrays":  # the group commit's statement (more keys than the few-key one takes)
        monkeypatch.setattr(row_locks, "SMALL", 0)
    _warm(e, "one", start, [])
    assert _write(e, _main("one", start)).stored == 120
    ca, cb = _two_caches(e, "two", start)
    main = _main("two", start)
    held: list[tuple[int, int]] = []
    ra, rb = _concurrently(e, _fields(main, FIRST, "two-a"), _fields(main, SECOND, "two-b"), ca, cb, held)
    assert (ra.stored, rb.stored) == (120, 120)  # every row of either piece brought fields
    one, two = _stored(e, "one"), _stored(e, "two")
    # Warm-up and pieces, each row once; raw rows, rollups, features and histograms all equal.
    assert (one["raw_count"], two["raw_count"], _differences(one, two)) == (3 * 60 + 60 + 120, 360, [])
    assert [r[2] for r in one["features"]] == [r[2] for r in two["features"]]
    with e.connect() as c:
        node = c.exec_driver_sql("SELECT id FROM nodes WHERE name = 'node-two'").scalar_one()
    days = sorted({int(start // 86400), int((start + 59) // 86400)})
    assert held == [(node, d) for d in days]  # one key per (node, day), two across midnight


def test_a_field_in_both_pieces_keeps_the_first_committed_value(e: Engine) -> None:
    _warm(e, "one", MINUTE, [])
    _write(e, _main("one", MINUTE))
    ca, cb = _two_caches(e, "two", MINUTE)
    main, other = _main("two", MINUTE), _main("two", MINUTE, seed=99)
    a = _fields(main, (*FIRST, "power_w"), "two-a")
    b = _fields(main, SECOND, "two-b")
    b.samples["power_w"] = other.samples["power_w"]  # power_w in both pieces, B's other values
    assert a.samples["power_w"] != b.samples["power_w"]
    ra, rb = _concurrently(e, a, b, ca, cb)
    assert (ra.stored, rb.stored) == (120, 120)
    one, two = _stored(e, "one"), _stored(e, "two")
    # A's power_w (the one request's), every row counted once.
    assert (two["raw_count"], _differences(one, two)) == (one["raw_count"], [])


def test_a_piece_repeating_the_whole_row_stores_nothing(e: Engine) -> None:
    """B carries only fields A stored: not counted, nothing folded twice."""
    _warm(e, "one", MINUTE, [])
    _write(e, _main("one", MINUTE))
    ca, cb = _two_caches(e, "two", MINUTE)
    main = _main("two", MINUTE)
    ra, rb = _concurrently(e, _fields(main, CATALOG.names, "two-a"), _fields(main, SECOND, "two-b"), ca, cb)
    assert (ra.stored, rb.stored) == (120, 0)
    assert _differences(_stored(e, "one"), _stored(e, "two")) == []


def test_the_keys_are_the_node_days_with_rows_sorted() -> None:
    from gpufleet.storage.prepared import Prepared

    def prep(*ts: float) -> Prepared:
        p = prepare(make_batch("n", gpus=1, seconds=1))
        p.ts = np.array(ts)
        return p

    d = 86400.0
    preps = [prep(5 * d + 10, 6 * d - 1), prep(6 * d + 1), prep(2 * d, 9 * d, 9 * d + 5), prep()]
    # Batch 2 spans a week but has rows on two days only (an import chunk); batch 3 has none.
    assert row_locks.node_days(preps, [0, 1, 2, 3], [9, 9, 4, 1]) == [(4, 2), (4, 9), (9, 5), (9, 6)]
    assert row_locks.node_days(preps, [1], [9, 9, 4, 1]) == [(9, 6)]
