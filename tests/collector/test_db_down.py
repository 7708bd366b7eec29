"""While the database refuses connections (issue 18 item 6): ingest answers 503 with
Retry-After (what the protocol promises, so agents keep their spool and retry), API reads
answer a JSON 503, no request logs a traceback, and everything works again afterwards with
nothing lost or doubled. Real PostgreSQL: the test's database stops accepting connections
(``ALLOW_CONNECTIONS false`` and its sessions terminated), as during a restart or failover."""

from __future__ import annotations

import logging
import time

import httpx
import psycopg

from gpufleet.storage import tokens
from gpufleet.storage.db import make_engine

from .conftest import make_batch
from .test_ingest import counts, post


def _allow(pg_url: str, allow: bool) -> None:
    db = pg_url.rsplit("/", 1)[1]
    admin = pg_url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(f'ALTER DATABASE "{db}" ALLOW_CONNECTIONS {"true" if allow else "false"}')
        if not allow:
            c.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s "
                      "AND pid <> pg_backend_pid()", (db,))


def test_database_down_is_503_with_retry_after_and_no_traceback(pg_url, live_server, caplog) -> None:
    e = make_engine(pg_url)
    agent = tokens.create_token(e, "a", "agent")
    viewer = tokens.create_token(e, "v", "viewer")
    e.dispose()
    srv = live_server(pg_url, allow_anonymous=False)
    now = time.time() - 60
    assert post(srv.url, make_batch("db-1", seq=0, start=now), token=agent).status_code == 200
    tokens._cache_clear()
    caplog.set_level(logging.INFO)
    _allow(pg_url, False)
    try:
        time.sleep(5.5)  # the collector's 5 s token cache expires: auth itself needs the database
        for seq in (1, 2):
            r = post(srv.url, make_batch("db-1", seq=seq, start=now + 10 * seq), token=agent)
            assert r.status_code == 503 and r.headers.get("retry-after"), (r.status_code, r.text)
            assert r.json()["detail"]
        api = httpx.get(srv.url + "/api/v1/jobs", headers={"Authorization": f"Bearer {viewer}"}, timeout=30)
        assert api.status_code == 503 and api.headers.get("retry-after"), (api.status_code, api.text)
        assert api.headers["content-type"].startswith("application/json") and api.json()["detail"]
    finally:
        _allow(pg_url, True)
    tracebacks = [r for r in caplog.records if r.exc_info]
    assert not tracebacks, [r.getMessage() for r in tracebacks]
    # back up: the retried batches are stored once, the API answers
    for seq in (1, 2):
        for _ in range(50):
            r = post(srv.url, make_batch("db-1", seq=seq, start=now + 10 * seq), token=agent)
            if r.status_code != 503:
                break
            time.sleep(0.2)
        assert r.json() == {"stored": 80, "duplicate": False}
    assert httpx.get(srv.url + "/api/v1/jobs", headers={"Authorization": f"Bearer {viewer}"},
                     timeout=30).status_code == 200
    assert counts(pg_url)["raw_samples"] == 240
