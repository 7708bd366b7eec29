"""The group writer's linger: while requests it was told about (``incoming``, the remote-write
receiver's bodies still being parsed) are on their way, a group waits for them, at most
``linger_s``, so one commit folds several scrapes; with nothing on its way a lone batch is
written at once, a count that never falls cannot hold a batch past the linger, and stopping
writes what a lingering group holds. Every batch is stored exactly once.

No time is asserted: where the point is that something other than the linger ended a wait, the
linger is an hour (LINGER_S) and the wait is bounded at HANG_S, which only catches a hang."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from .conftest import make_batch

LINGER_S = 3600.0  # a linger no test waits out: a wait that ends at all was ended by something else
HANG_S = 240.0  # only catches a hang


@pytest.fixture
def writer(sqlite_url: str) -> Any:
    from gpufleet.collector.writer import GroupWriter
    from gpufleet.storage.db import make_engine

    engine = make_engine(sqlite_url)
    w = GroupWriter(engine, queue_rows=100_000, group_rows=50_000)
    w.start()
    yield w
    w.stop()
    engine.dispose()


def _preps(n: int) -> list[Any]:
    from gpufleet.collector.columns import prepare

    # distinct nodes: distinct batch keys and GPUs, so each batch stores all its rows
    return [prepare(make_batch(gpus=2, seconds=4, start=time.time() - 60, node=f"linger-{i}")) for i in range(n)]


def _stored(w: Any) -> int:
    from gpufleet.storage.raw_read import count_raw_samples

    with w.engine.connect() as c:
        return int(count_raw_samples(c))


def test_a_group_waits_for_the_bodies_on_their_way(writer: Any) -> None:
    a, b, c = _preps(3)
    on_way = [1]
    writer.incoming = lambda: on_way[0]
    writer.linger_s = LINGER_S

    async def go() -> list[Any]:
        fa = writer.submit(a)
        await asyncio.sleep(0.3)  # the writer holds a, waiting for what is being parsed
        assert not fa.done()
        fb, fc = writer.submit(b), writer.submit(c)
        await asyncio.sleep(0.2)
        on_way[0] = 0
        writer.nudge()
        return list(await asyncio.wait_for(asyncio.gather(fa, fb, fc), HANG_S))  # the nudge ended the wait

    res = asyncio.run(go())
    assert writer.commits == 1 and writer.batches == 3
    assert [r.stored for r in res] == [a.n, b.n, c.n] and not any(r.duplicate for r in res)
    assert _stored(writer) == a.n + b.n + c.n


def test_nothing_on_its_way_writes_a_lone_batch_at_once(writer: Any) -> None:
    (a,) = _preps(1)
    writer.incoming = lambda: 0
    writer.linger_s = LINGER_S

    async def go() -> Any:
        return await asyncio.wait_for(writer.submit(a), HANG_S)

    res = asyncio.run(go())
    assert res.stored == a.n and writer.commits == 1


def test_a_count_that_never_falls_holds_a_batch_only_for_the_linger(writer: Any) -> None:
    (a,) = _preps(1)
    writer.incoming = lambda: 1  # a parse that never hands over (a stuck or leaked count)
    writer.linger_s = 0.3

    async def go() -> Any:
        return await asyncio.wait_for(writer.submit(a), HANG_S)

    t0 = time.monotonic()
    res = asyncio.run(go())
    assert time.monotonic() - t0 >= 0.25  # it held the batch for the linger (a loaded box only adds)
    assert res.stored == a.n and _stored(writer) == a.n


def test_stopping_writes_a_lingering_group(sqlite_url: str) -> None:
    from gpufleet.collector.writer import GroupWriter
    from gpufleet.storage.db import make_engine

    engine = make_engine(sqlite_url)
    w = GroupWriter(engine, queue_rows=100_000, group_rows=50_000)
    w.incoming = lambda: 1
    w.linger_s = LINGER_S
    w.start()
    (a,) = _preps(1)

    async def go() -> Any:
        fut = w.submit(a)
        await asyncio.sleep(0.3)
        assert not fut.done()
        await asyncio.get_running_loop().run_in_executor(None, w.stop)
        return await asyncio.wait_for(fut, HANG_S)  # stopping ended the wait

    res = asyncio.run(go())
    assert res.stored == a.n
    w.engine = engine
    assert _stored(w) == a.n
    engine.dispose()


def test_a_full_group_does_not_wait(sqlite_url: str) -> None:
    """The next batch does not fit in the group (group_rows): the group is written at once,
    the linger notwithstanding, and the batch left over goes in the next group."""
    from gpufleet.collector.writer import GroupWriter
    from gpufleet.storage.db import make_engine

    a, b = _preps(2)
    engine = make_engine(sqlite_url)
    w = GroupWriter(engine, queue_rows=100_000, group_rows=a.n + b.n - 1)  # a and b never share one
    w.incoming = lambda: 1
    w.linger_s = LINGER_S

    async def go() -> Any:
        fa = w.submit(a)
        w.submit(b)  # both queued before the writer runs
        w.start()
        return await asyncio.wait_for(fa, HANG_S)  # a full group ended the wait

    try:
        ra = asyncio.run(go())
        assert ra.stored == a.n
    finally:
        w.stop()  # b, lingering alone in the next group, is written on the way out
    assert _stored(w) == a.n + b.n
    engine.dispose()
