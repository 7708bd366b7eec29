"""The write path's memory of stored timestamps per GPU-minute (``WriteCache.stored_minutes``,
``unique_rows.new_rows(known=...)``), on the receive side's worst case: a sender's shards
deliver one GPU's fields in pieces, scrapes out of order, and copies again under new request
keys, spread over two collector processes (two caches) writing one database. The memory may
only spare reads: every (GPU, ts) row, its fields and the rollups must be what the same writes
store without it, and no row twice."""

from __future__ import annotations

import random
import time

import pytest
from sqlalchemy import text

from gpufleet.collector.columns import prepare
from gpufleet.collector.remote_write import wire
from gpufleet.collector.remote_write.mapping import RateState, SeriesMap, convert
from gpufleet.storage import raw_read, unique_rows, writes
from gpufleet.storage.db import make_engine
from gpufleet.storage.write_cache import WriteCache
from tests.prometheus.captures import body
from tests.prometheus.rwclient import stored
from tests.raw_samples_helpers import uuid_records

T0 = (int(time.time()) // 60 - 30) * 60_000  # a minute's start, half an hour ago (ms)
PARTS = (("DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_SM_CLOCK"), ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_TEMP"))


def _requests(seed: int, *, split: bool = True) -> list[bytes]:
    """Per GPU and scrape (15 s apart: four a minute) its fields in two requests (``split``)
    plus copies of some (a retry through a re-compressing proxy, an HA replica), or in one
    request and no copies; shuffled (scrapes arrive late)."""
    out = []
    rnd = random.Random(seed)
    for k in range(8):
        for g in range(3):
            gpu = {"UUID": f"GPU-mem{g}", "gpu": str(g), "Hostname": "node-mem"}
            for part in PARTS if split else (PARTS[0] + PARTS[1],):
                out.append(body([({"__name__": name, **gpu}, [(T0 + k * 15_000, 40.0 + k + g)]) for name in part]))
    if split:
        out += rnd.sample(out, len(out) // 3)
    rnd.shuffle(out)
    return out


def _write_all(url: str, requests: list[bytes], caches: int | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each request in its own transaction, on ``caches`` alternating caches with the memory
    wired into write_batches (None: without it, the reference)."""
    engine = make_engine(url)
    held = [WriteCache() for _ in range(caches or 1)]
    now = time.time()
    cur: list[WriteCache] = [held[0]]
    if caches is not None:
        real = unique_rows.new_rows
        monkeypatch.setattr(writes, "new_rows",
                            lambda conn, ts, g, v: real(conn, ts, g, v, cur[0].stored_minutes))
    for i, raw in enumerate(requests):
        conv = convert(wire.decode(raw), SeriesMap(), RateState(), cluster="default", digest=f"r{i}", now=now,
                       max_age_s=None, max_future_s=300, max_rows=20_000)
        cur[0] = held[i % len(held)]
        with engine.begin() as conn:
            writes.write_batches(conn, [prepare(b) for b in conv.batches], now, cur[0])
    monkeypatch.undo()
    engine.dispose()


def _state(url: str) -> tuple[object, ...]:
    engine = make_engine(url)
    with engine.connect() as c:
        rows = sorted((r["uuid"], r["ts"], r["power_w"], r["sm_clock_mhz"], r["gpu_util"], r["temp_c"])
                      for r in uuid_records(c))
        rollups = sorted(tuple(r) for r in c.execute(text(
            "select g.uuid, r.bucket, r.n, r.last_ts from gpu_samples_1m r join gpus g on g.id = r.gpu_pk")))
    counts = stored(engine)
    engine.dispose()
    return rows, rollups, max(counts.values()), len(counts)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_two_processes_remembering_store_what_reading_every_time_stores(pg_factory, monkeypatch, seed) -> None:
    requests = _requests(seed)
    ref, mem = pg_factory.migrated(), pg_factory.migrated()
    _write_all(ref, requests, None, monkeypatch)
    _write_all(mem, requests, 2, monkeypatch)
    want = _state(ref)
    assert want[2] == 1 and want[3] == 3 * 8  # every (GPU, ts) once
    assert all(None not in r for r in want[0])  # every row has both requests' fields
    assert _state(mem) == want


def test_one_process_remembering_reads_no_block_for_late_scrapes(sqlite_url, tmp_path, monkeypatch) -> None:
    """One process, whole rows arriving late (before rows stored in their minute, at other
    timestamps): decided without decoding a stored block, where the reference decodes them,
    and stored the same."""
    from gpufleet.storage.migrate import upgrade

    requests = _requests(4, split=False)
    ref = f"sqlite:///{tmp_path / 'ref.db'}"
    upgrade(ref)
    decoded = {"ref": 0, "mem": 0}
    real = raw_read.decode_blocks
    for who, url, caches in (("ref", ref, None), ("mem", sqlite_url, 1)):
        def counting(blocks, _who=who):
            decoded[_who] += len(blocks)
            return real(blocks)

        with monkeypatch.context() as m:
            m.setattr(raw_read, "decode_blocks", counting)
            _write_all(url, requests, caches, m)
    assert _state(sqlite_url) == _state(ref)
    assert decoded["mem"] == 0 < decoded["ref"], decoded
