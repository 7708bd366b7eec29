"""Several collectors on one database, daily partitions, retention, group commit."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import text

from gpufleet.storage import retention
from gpufleet.storage.db import make_engine
from gpufleet.storage.raw_read import count_raw_samples
from gpufleet.storage.write_cache import WriteCache
from tests.raw_samples_helpers import uuid_records

from .conftest import make_batch, store
from .test_ingest import counts, post


def post_as_agent(url, batch):  # type: ignore[no-untyped-def]  # test helper around test_ingest.post
    """POST like the agent: 429/503 are transient by the protocol (two processes' concurrent
    first writes of the same dimensions can be refused once under load), so retry them after
    Retry-After; any other answer is returned as is for the test to judge."""
    for _ in range(20):
        r = post(url, batch)
        if r.status_code not in (429, 503):
            return r
        time.sleep(min(float(r.headers.get("retry-after", "1")), 1.0))
    return r


def test_two_collectors_same_batches_stored_once(database_url, live_server) -> None:
    """Two collector instances (own writer, own engine) behind a 'load balancer' that sends
    every batch to both at once: each batch is stored exactly once."""
    a, b = live_server(database_url), live_server(database_url)
    start = time.time() - 120
    batches = [make_batch(f"n{i % 4}", seq=i // 4, start=start + (i // 4) * 10, gpus=4, job=f"j{i % 2}")
               for i in range(16)]
    answers: list[dict] = []
    lock = threading.Lock()

    def send(url: str, order: list[int]) -> None:
        for i in order:
            r = post(url, batches[i])
            assert r.status_code == 200, r.text
            with lock:
                answers.append(r.json())

    ta = threading.Thread(target=send, args=(a.url, list(range(16))))
    tb = threading.Thread(target=send, args=(b.url, list(reversed(range(16)))))
    ta.start()
    tb.start()
    ta.join(120)
    tb.join(120)
    assert len(answers) == 32
    assert sum(x["stored"] for x in answers) == 16 * 40
    assert sum(x["duplicate"] for x in answers) == 16
    c = counts(database_url)
    assert c["raw_samples"] == 16 * 40 and c["ingest_batches"] == 16
    e = make_engine(database_url)
    with e.connect() as conn:
        assert conn.execute(text("select coalesce(sum(n), 0) from gpu_samples_1m")).scalar_one() == 16 * 40
        assert conn.execute(text("select count(*) from allocations where end_ts is null")).scalar_one() == 16
    e.dispose()


def test_group_commit_many_batches_one_transaction(database_url) -> None:
    """The writer's unit of work: many batches, duplicates inside the group, one commit."""
    e = make_engine(database_url)
    now = time.time()
    bs = [make_batch(f"g{i}", seq=0, start=now - 60, gpus=2) for i in range(30)]
    bs.append(bs[3])  # the same key twice in one group
    cache = WriteCache()
    with e.begin() as c:
        r = store(c, bs, now, cache)
    assert [x.duplicate for x in r.results].count(True) == 1 and r.stored == 30 * 20
    with e.begin() as c:  # cached dimensions, all duplicates now
        r2 = store(c, bs, now, cache)
    assert r2.duplicate and r2.stored == 0
    e.dispose()
    assert counts(database_url)["raw_samples"] == 600


def test_partitions_and_retention(pg_url) -> None:
    e = make_engine(pg_url)
    now = time.time()
    day = retention.day_of(now)
    old = make_batch("r1", seq=0, start=day - 20 * 86400 + 100, gpus=1, seconds=2)  # 20 days ago
    new = make_batch("r1", seq=1, start=now - 60, gpus=1, seconds=2)
    with e.begin() as c:
        store(c, [old, new], now)
    assert retention.ensure_ahead(e, now) >= 1  # tomorrow's partitions did not exist yet
    with e.connect() as c:
        parts = dict(retention.list_partitions(c, "gpu_sample_blocks"))
    assert retention.partition_name("gpu_sample_blocks", day) in parts
    assert retention.partition_name("gpu_sample_blocks", day - 20 * 86400) in parts
    assert retention.partition_name("gpu_sample_blocks", day + 86400) in parts
    dropped = retention.apply_retention(e, now, raw_days=14, rollup_days=400)
    assert dropped["gpu_sample_blocks"] == 1 and dropped["gpu_samples_1m"] == 0
    with e.connect() as c:
        assert count_raw_samples(c) == 2
        assert c.execute(text("select count(*) from gpu_samples_1m")).scalar_one() == 2
    e.dispose()


def test_retention_sqlite(sqlite_url) -> None:
    e = make_engine(sqlite_url)
    now = time.time()
    with e.begin() as c:
        store(c, [make_batch("r1", seq=0, start=now - 20 * 86400, gpus=1, seconds=2),
                          make_batch("r1", seq=1, start=now - 60, gpus=1, seconds=2)], now)
    out = retention.apply_retention(e, now, raw_days=14, rollup_days=400)
    assert out["gpu_sample_blocks"] == 1 and out["gpu_samples_1m"] == 0
    with e.connect() as c:
        assert count_raw_samples(c) == 2
    e.dispose()


@pytest.mark.parametrize("n_days", [3])
def test_import_spanning_days_creates_partitions(pg_url, tmp_path, n_days) -> None:
    import json

    from gpufleet.collector.ndjson import import_file

    p = tmp_path / "days.ndjson"
    start = retention.day_of(time.time()) - 10 * 86400
    with p.open("w") as f:
        for d in range(n_days):
            f.write(json.dumps({"ts": start + d * 86400 + 5, "node": "n", "gpu": 0, "sm_active": 0.5}) + "\n")
    e = make_engine(pg_url)
    assert import_file(e, str(p)).stored == n_days
    with e.connect() as c:
        names = {n for n, _ in retention.list_partitions(c, "gpu_sample_blocks")}
    assert {retention.partition_name("gpu_sample_blocks", start + d * 86400) for d in range(n_days)} <= names
    e.dispose()


def test_samples_round_trip_exactly(database_url) -> None:
    """Every stored cell equals what was sent (f4 columns to float32 precision), nulls and
    mixed job/no-job rows included: checks the numpy-built binary COPY stream on PostgreSQL."""
    from gpufleet.catalog import CATALOG

    now = time.time()
    b = make_batch("rt", seq=0, start=now - 60, gpus=3, seconds=4, seed=7)
    b.samples["job"][1] = None
    b.samples["sm_active"][2] = None
    b.samples["xid_last"][5] = None
    b.samples["energy_j"] = [None] * len(b.samples["ts"])
    e = make_engine(database_url)
    with e.begin() as c:
        store(c, [b], now)
    with e.connect() as c:
        job_ids = dict(c.execute(text("select id, job_id from jobs")).all())
        rows = [{**r, "job_id": job_ids.get(r["job_pk"])} for r in uuid_records(c)]
    e.dispose()
    got = {(r["uuid"], r["ts"]): r for r in rows}
    assert len(got) == len(b.samples["ts"]) == 12
    for i, (u, t) in enumerate(zip(b.samples["gpu"], b.samples["ts"], strict=True)):
        r = got[(u, t)]
        assert r["job_id"] == b.samples["job"][i]
        for f in CATALOG.fields:
            sent, stored = b.samples[f.name][i], r[f.name]
            if sent is None:
                assert stored is None, (f.name, i)
            elif f.dtype == "f4":
                assert stored == pytest.approx(sent, rel=1e-6), (f.name, i)
            else:
                assert stored == sent, (f.name, i)


def test_serve_with_two_worker_processes(pg_url, tmp_path) -> None:
    """`gpufleet serve --workers 2`: each forked process runs its own lifespan, queue and
    writer; together they store every batch exactly once."""
    import os
    import signal
    import socket
    import subprocess
    import sys
    from concurrent.futures import ThreadPoolExecutor

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = (tmp_path / "serve.log").open("wb")
    p = subprocess.Popen([sys.executable, "-m", "gpufleet.cli", "serve", "--database-url", pg_url, "--port", str(port),
                          "--workers", "2", "--allow-anonymous"], stdout=log, stderr=subprocess.STDOUT,
                         start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                if post(url, make_batch("warm", seq=0, start=time.time() - 30, gpus=1, seconds=1)).status_code == 200:
                    break
            except Exception:  # not listening yet
                time.sleep(0.3)
        start = time.time() - 300
        batches = [make_batch(f"w{i % 10}", seq=i // 10, start=start + (i // 10) * 10, gpus=2) for i in range(60)]
        with ThreadPoolExecutor(8) as ex:
            first = list(ex.map(lambda b: post_as_agent(url, b).json(), batches))
            again = list(ex.map(lambda b: post_as_agent(url, b).json(), batches))  # retries, any process
    finally:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(30)
        log.close()
    assert all(not x["duplicate"] and x["stored"] == 20 for x in first), first
    assert all(x["duplicate"] for x in again)
    assert counts(pg_url)["raw_samples"] == 60 * 20 + 1
    pids = {line.split("[")[1].split("]")[0] for line in (tmp_path / "serve.log").read_text().splitlines()
            if "Started server process" in line}
    assert len(pids) == 2, (tmp_path / "serve.log").read_text()[-2000:]


def test_partial_fields_and_idle_gpus(database_url) -> None:
    """A batch with only some catalog fields, where some GPUs run no job (null job in the
    newest row of a minute): stored, rolled up, job-less GPU rollups have no job."""
    now = time.time()
    b = make_batch("idle", seq=0, start=now - 60, gpus=2, seconds=3, fields=("sm_active", "clock_event_reasons"))
    b.samples["job"] = [None if u == b.gpus[1].uuid else j for u, j in zip(b.samples["gpu"], b.samples["job"],
                                                                           strict=True)]
    b.samples["clock_event_reasons"][0] = None
    e = make_engine(database_url)
    with e.begin() as c:
        assert store(c, [b], now).stored == 6
    with e.connect() as c:
        rows = c.execute(text("select g.uuid, r.job_pk, r.n, r.clock_event_reasons, r.temp_c from gpu_samples_1m r "
                              "join gpus g on g.id = r.gpu_pk")).all()
    e.dispose()
    by = {}
    for uuid, job_pk, n, _cer, temp in rows:
        by.setdefault(uuid, []).append((job_pk, n, temp))
    assert all(job is None for job, _, _ in by[b.gpus[1].uuid])
    assert all(job is not None for job, _, _ in by[b.gpus[0].uuid])
    assert sum(n for v in by.values() for _, n, _ in v) == 6
    assert all(temp is None for v in by.values() for _, _, temp in v)
