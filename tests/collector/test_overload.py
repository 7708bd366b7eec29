"""A full write queue answers 503 + Retry-After at once; what was accepted is stored."""

from __future__ import annotations

import sqlite3
import threading
import time

import httpx

from .conftest import make_batch
from .test_ingest import counts, post


def test_full_queue_is_503_with_retry_after(sqlite_url, live_server, monkeypatch) -> None:
    monkeypatch.setenv("GPUFLEET_INGEST_QUEUE_ROWS", "100")
    srv = live_server(sqlite_url)
    path = sqlite_url.removeprefix("sqlite:///")
    assert post(srv.url, make_batch("warm", seq=0, start=time.time() - 30)).status_code == 200
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")  # the writer now waits on the database
    results: dict[int, httpx.Response] = {}

    def send(i: int) -> None:
        results[i] = post(srv.url, make_batch(f"n{i}", seq=0, start=time.time() - 30))

    try:
        first = threading.Thread(target=send, args=(0,))
        first.start()
        coll = srv.app.state.collector
        deadline = time.time() + 10
        while coll.writer.writing_rows < 80 and time.time() < deadline:  # the writer holds batch 0
            time.sleep(0.02)
        assert coll.writer.writing_rows == 80
        second = threading.Thread(target=send, args=(1,))
        second.start()
        while coll.writer.pending_rows < 80 and time.time() < deadline:
            time.sleep(0.02)
        send(2)  # 80 waiting + 80 more > 100: refused at once
        r = results[2]
        assert r.status_code == 503 and int(r.headers["Retry-After"]) >= 1, r.text
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    first.join(30)
    second.join(30)
    assert results[0].status_code == 200 and results[1].status_code == 200
    assert counts(sqlite_url)["raw_samples"] == 3 * 80  # warm-up + the two accepted; not the refused one
    # The refused batch is simply retried later (same key) and stored once.
    assert post(srv.url, make_batch("n2", seq=0, start=time.time() - 30)).json() == {"stored": 80, "duplicate": False}
