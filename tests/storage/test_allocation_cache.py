"""The writer's allocation cache: a GPU that keeps its job is not re-read every group commit,
and every job change still opens and closes allocations exactly as without the cache."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from sqlalchemy import event, text

from gpufleet.storage import retention
from gpufleet.storage.write_cache import ALLOC_TRUST_S, WriteCache

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from collector.conftest import make_batch, store

T0 = 1_790_000_000.0


def _write(engine: Any, cache: WriteCache, seq: int, start: float, job: str | None, now: float) -> None:
    b = make_batch("alloc-node", seq=seq, start=start, gpus=2, seconds=10, job=job, fields=("sm_active",))
    retention.ensure_partitions(engine, retention.days_of([start]))
    with engine.begin() as c:
        store(c, [b], now, cache)


def _allocations(engine: Any) -> list[tuple[str, float, float | None]]:
    with engine.connect() as c:
        return [tuple(r) for r in c.execute(text(  # type: ignore[misc]
            "select j.job_id, a.start_ts, a.end_ts from allocations a join jobs j on j.id = a.job_pk "
            "join gpus g on g.id = a.gpu_pk where g.\"index\" = 0 order by a.start_ts"))]


def test_steady_job_is_read_once_and_changes_still_recorded(engine) -> None:  # type: ignore[no-untyped-def]
    reads: list[str] = []

    def count(conn, cursor, statement, params, context, executemany):  # type: ignore[no-untyped-def]
        if re.search(r"from allocations where end_ts is null", statement.lower()):
            reads.append(statement)

    event.listen(engine, "before_cursor_execute", count)
    cache = WriteCache()
    try:
        _write(engine, cache, 0, T0, "A", T0 + 10)  # opens A: written, so not trusted yet
        _write(engine, cache, 1, T0 + 10, "A", T0 + 20)  # read back: A confirmed
        assert len(reads) == 2
        for k in range(2, 5):  # steady state: no reads
            _write(engine, cache, k, T0 + 10 * k, "A", T0 + 10 * k + 10)
        assert len(reads) == 2
        _write(engine, cache, 5, T0 + 50, "B", T0 + 60)  # job change: read, close A, open B
        assert len(reads) == 3
        _write(engine, cache, 6, T0 + 60, "B", T0 + 70)
        _write(engine, cache, 7, T0 + 70, "B", T0 + 80)
        assert len(reads) == 4
        # An entry older than ALLOC_TRUST_S is read again, whatever the rows say.
        _write(engine, cache, 8, T0 + 80, "B", T0 + 80 + ALLOC_TRUST_S + 1)
        assert len(reads) == 5
        _write(engine, cache, 9, T0 + 90, None, T0 + 200)  # job ends: B closed
    finally:
        event.remove(engine, "before_cursor_execute", count)
    assert _allocations(engine) == [("A", T0, T0 + 50), ("B", T0 + 50, T0 + 90)]


def test_cache_matches_a_writer_without_one(engine) -> None:  # type: ignore[no-untyped-def]
    """The same sequence through a fresh cache per write (always reading) gives the same rows."""
    cache = WriteCache()
    plan = [("A", 0), ("A", 10), ("A", 20), (None, 30), (None, 40), ("B", 50), ("B", 60), ("A", 70), ("A", 80)]
    for k, (job, dt) in enumerate(plan):
        _write(engine, cache, k, T0 + dt, job, T0 + dt + 10)
    with_cache = _allocations(engine)
    with engine.begin() as c:
        # the same samples again: every table they went into starts empty (one sample per (GPU, ts))
        for t in ("allocations", "ingest_batches", "gpu_sample_blocks", "gpu_samples_1m", "job_samples_1m"):
            c.execute(text(f"delete from {t}"))
    for k, (job, dt) in enumerate(plan):
        _write(engine, WriteCache(), 100 + k, T0 + dt, job, T0 + dt + 10)
    assert _allocations(engine) == with_cache
    assert [r[0] for r in with_cache] == ["A", "B", "A"]
