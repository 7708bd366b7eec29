"""The group writer retries a transient error that the driver raised itself (a deadlock lost in
the write path's own psycopg statements; sqlite's "database is locked"): the batch is stored
once and acknowledged, never answered 500 after a one-by-one replay of the group."""

from __future__ import annotations

import sqlite3
import time
from typing import Any

import psycopg.errors as pe
import pytest

from .conftest import make_batch


@pytest.mark.parametrize("exc", [pe.DeadlockDetected("deadlock detected"), sqlite3.OperationalError("locked")])
def test_the_group_writer_retries_an_unwrapped_transient_error(sqlite_url: str, exc: BaseException,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The first attempt of a group fails as a deadlock would; the writer retries it and the
    batch is stored once, acknowledged (not a 500, not split one by one)."""
    import asyncio

    from gpufleet.collector import writer as writer_mod
    from gpufleet.collector.columns import prepare
    from gpufleet.storage.db import make_engine
    from gpufleet.storage.raw_read import count_raw_samples

    real = writer_mod.write_batches
    calls: list[int] = []

    def flaky(*args: Any, **kw: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise exc
        return real(*args, **kw)

    monkeypatch.setattr(writer_mod, "write_batches", flaky)
    engine = make_engine(sqlite_url)
    w = writer_mod.GroupWriter(engine, queue_rows=10_000, group_rows=5_000)
    w.start()
    try:
        prep = prepare(make_batch(gpus=2, seconds=4, start=time.time() - 60))

        async def go() -> Any:
            return await w.submit(prep)

        res = asyncio.run(go())
    finally:
        w.stop()
    assert len(calls) == 2 and not res.duplicate and res.stored == prep.n
    with engine.connect() as c:
        assert count_raw_samples(c) == prep.n
    engine.dispose()
