"""One sample per (GPU, ts) (issue 18 item 10): a batch repeating a (GPU, ts) is refused
naming the row; rows already stored under another batch key are skipped, not stored twice, and
never inflate the rollups; late rows between stored ones are kept. Over real HTTP into SQLite
and PostgreSQL."""

from __future__ import annotations

import time

from sqlalchemy import text

from gpufleet.storage.db import make_engine
from gpufleet.storage.raw_read import raw_records

from .conftest import make_batch
from .test_ingest import counts, post

# --- item 10: one sample per (GPU, ts) ---------------------------------------------------

def test_duplicate_rows_within_a_batch_are_refused_naming_the_row(database_url, live_server) -> None:
    srv = live_server(database_url)
    b = make_batch("dup-1", seq=0, start=time.time() - 60, gpus=2, seconds=3)
    for col in b.samples.values():
        col.append(col[2])  # row 6 repeats row 2's (gpu, ts)
    r = post(srv.url, b)
    assert r.status_code == 422 and "samples.ts[6]" in r.json()["detail"] and "row 2" in r.json()["detail"], r.text
    assert counts(database_url)["raw_samples"] == 0


def test_same_rows_under_two_keys_are_stored_once(database_url, live_server) -> None:
    srv = live_server(database_url)
    start = time.time() - 300
    a = make_batch("dup-2", seq=0, boot_id="boot-a", start=start, gpus=2, seconds=10)
    b = make_batch("dup-2", seq=0, boot_id="boot-b", start=start, gpus=2, seconds=10)  # same rows, new key
    c = make_batch("dup-2", seq=1, boot_id="boot-b", start=start + 5, gpus=2, seconds=10)  # half overlap
    ra, rb, rc = post(srv.url, a), post(srv.url, b), post(srv.url, c)
    assert ra.json() == {"stored": 20, "duplicate": False}
    assert rb.status_code == 200 and rb.json()["stored"] == 0, rb.text
    assert rc.status_code == 200 and rc.json()["stored"] == 10, rc.text
    e = make_engine(database_url)
    with e.connect() as conn:
        keys = [(r["gpu_pk"], r["ts"]) for r in raw_records(conn)]
        raw = (len(keys), len(set(keys)))
        n = conn.execute(text("select sum(n) from gpu_samples_1m")).scalar_one()
        jn = conn.execute(text("select sum(n) from job_samples_1m")).scalar_one()
    e.dispose()
    assert tuple(raw) == (30, 30) and n == 30 and jn == 30


def test_late_rows_between_stored_ones_are_kept(database_url, live_server) -> None:
    """Out of order is not duplicate: even seconds first, then the odd ones of the same minute."""
    srv = live_server(database_url)
    start = (time.time() // 60 - 3) * 60
    even = make_batch("ooo", seq=0, start=start, gpus=1, seconds=20)
    odd = make_batch("ooo", seq=1, start=start, gpus=1, seconds=20)
    keep_even = [i for i, t in enumerate(even.samples["ts"]) if int(t - start) % 2 == 0]
    keep_odd = [i for i, t in enumerate(odd.samples["ts"]) if int(t - start) % 2 == 1]
    for bb, keep in ((even, keep_even), (odd, keep_odd)):
        for k in list(bb.samples):
            bb.samples[k] = [bb.samples[k][i] for i in keep]
    assert post(srv.url, even).json()["stored"] == 10
    assert post(srv.url, odd).json()["stored"] == 10
    assert post(srv.url, make_batch("ooo", seq=2, start=start, gpus=1, seconds=20)).json()["stored"] == 0
    assert counts(database_url)["raw_samples"] == 20
