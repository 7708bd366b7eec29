"""Fuzzing every intake surface with values drawn from the intake schema (collector/
intake_schema.py): for each field of each section, values inside its bound, at it, just past
it, NaN/Inf, NUL bytes, over-long text, 64-bit extremes. Against the real collector over HTTP
on SQLite and PostgreSQL:

* ingest (progress, collectives, nics, gpu_nics beside GPU rows): never a 5xx; the GPU rows
  are stored; exactly the records the schema refuses are named in ``refused``; the rest are
  stored; a resend is a duplicate and stores nothing twice; the agent's spool never blocks
  (the fuzzed batch and a good one behind it both leave it);
* remote write (label values and sample values, DCGM and NCCL Inspector series): never a 5xx;
  a retry stores nothing twice;
* import (NDJSON lines): never a 5xx;
* the progress relay (datagrams, no database): never raises, its bytes stay bounded.

``GPUFLEET_FUZZ_EXAMPLES`` sets the examples per surface (default 25, a few seconds each; the
figures in docs/reliability.md are from a run with 500)."""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any

import httpx
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from gpufleet import protocol
from gpufleet.collector import intake_schema as schema
from gpufleet.collector.intake_schema import Bound
from gpufleet.protocol import CollectiveAgg, GpuNic, NicSample, ProgressWindow
from gpufleet.storage.db import make_engine
from tests.collector.conftest import make_batch

EXAMPLES = int(os.environ.get("GPUFLEET_FUZZ_EXAMPLES", "25"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=not os.environ.get("GPUFLEET_FUZZ_EXAMPLES"),
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large])
U64 = 2**64 - 1  # msgpack's integer range: -2^63 .. 2^64-1
NOW = time.time()


def _ints(b: Bound) -> st.SearchStrategy[Any]:
    lo, hi = int(max(b.lo, -(2**63))), int(min(b.hi, U64))
    edges = [lo, hi, lo - 1, hi + 1, 0, -1, 2**31 - 1, 2**31, 2**63 - 1, 2**63, -(2**63), U64]
    return st.one_of(st.integers(lo, hi), st.sampled_from([e for e in edges if -(2**63) <= e <= U64]))


def _floats(b: Bound) -> st.SearchStrategy[Any]:
    lo, hi = max(b.lo, -1e300), min(b.hi, 1e300)
    inside = st.floats(NOW - 3600, NOW) if b.kind == "epoch" else st.floats(lo, hi, allow_nan=False)
    return st.one_of(inside, st.sampled_from([math.nan, math.inf, -math.inf, lo, hi, -1.0, 0.0, 1e308, 86400.0]))


def _texts(b: Bound) -> st.SearchStrategy[str]:
    hi = int(b.hi)
    if b.choices:
        return st.one_of(st.sampled_from(b.choices), st.sampled_from(["", "x\x00", "PCIE"]))
    return st.one_of(st.text(st.characters(blacklist_categories=("Cs",)), min_size=int(b.lo), max_size=min(hi, 40)),
                     st.sampled_from(["", "a\x00b", "\x00", "x" * hi, "x" * (hi + 1), "é" * hi]))


def _json() -> st.SearchStrategy[Any]:
    leaf = st.one_of(st.none(), st.booleans(), st.floats(), st.integers(-(2**63), U64),
                     st.text(max_size=10), st.just("nul\x00"))
    return st.recursive(leaf, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
                        max_leaves=8)


def value_for(b: Bound) -> st.SearchStrategy[Any]:
    """Values for one field: inside the bound, at it, past it."""
    if b.kind == "int":
        s = _ints(b)
    elif b.kind in ("float", "epoch"):
        s = _floats(b)
    elif b.kind == "text":
        s = _texts(b)
    elif b.kind == "bool":
        s = st.booleans()
    elif b.kind == "json":
        s = st.lists(st.dictionaries(st.sampled_from(["ts", "name", "fields"]), _json(), max_size=3), max_size=4)
    else:
        keys = (st.one_of(st.integers(-300, 9000).map(str), st.sampled_from(["x", "1.5", ""]))
                if b.kind == "hist" else st.one_of(st.text(max_size=10), st.sampled_from(["", "k\x00", "k" * 70])))
        vals = _ints(Bound("int", b.lo, b.hi)) if b.kind in ("int_map", "hist") else _floats(Bound("float", b.lo, b.hi))
        s = st.dictionaries(keys, vals, max_size=4)
    return st.one_of(st.none(), s) if b.optional else s


STRUCTS: dict[str, type[msgspec.Struct]] = {"progress": ProgressWindow, "collectives": CollectiveAgg,
                                            "nics": NicSample, "gpu_nics": GpuNic}


def good_record(section: str) -> dict[str, Any]:
    s = (NOW // 10) * 10 - 60
    return {
        "progress": {"job_id": "fz-job", "rank": 0, "pid": 1, "start": s, "end": s + 10},
        "collectives": {"ts": NOW - 60, "comm": "0x1", "rank": 0, "coll": "AllReduce", "size_bucket": 1024,
                        "count": 1, "bytes": 1.0, "exec_us_p50": 1.0, "exec_us_p95": 1.0, "exec_us_max": 1.0},
        "nics": {"ts": NOW - 60, "nic": "mlx5_0/1", "interval_s": 10.0},
        "gpu_nics": {"gpu_uuid": "GPU-fz", "nic": "mlx5_0/1", "mode": "pcie"},
    }[section]


def record(section: str) -> st.SearchStrategy[Any]:
    """A record whose fields are mostly good, a few of them fuzzed (so both outcomes occur)."""
    bounds = schema.SECTIONS[section]
    fuzzed = st.dictionaries(st.sampled_from(sorted(bounds)), st.none(), min_size=0, max_size=3).flatmap(
        lambda picks: st.fixed_dictionaries({k: value_for(bounds[k]) for k in picks}))
    return fuzzed.map(lambda f: STRUCTS[section](**{**good_record(section), **f}))


TABLES = {"progress": "job_progress", "collectives": "collective_windows", "nics": "nic_samples",
          "gpu_nics": "gpu_nics"}


def count(engine: Any, sql: str) -> int:
    with engine.connect() as c:
        return int(c.execute(text(sql)).scalar_one())


@pytest.mark.parametrize("section", sorted(schema.SECTIONS))
def test_ingest_side_records(database_url: str, live_server: Any, tmp_path: Any, section: str) -> None:
    from gpufleet.agent.sender import Outcome, Sender
    from gpufleet.agent.spool import Spool

    srv = live_server(database_url)
    engine = make_engine(database_url)
    spool = Spool(tmp_path / "spool", 10**8, fsync=False)
    sender = Sender(spool, srv.url, token=None)
    seq = iter(range(10**6))
    table = TABLES[section]

    @FUZZ
    @given(st.lists(record(section), min_size=1, max_size=4))
    def run(records: list[Any]) -> None:
        n = next(seq)
        t0 = NOW - 20_000 + 3 * n  # every example's rows at their own seconds (no row stored before)
        b = msgspec.structs.replace(make_batch("fz-node", seq=2 * n, boot_id="fz", gpus=1, seconds=2, start=t0),
                                    **{section: records})
        good = make_batch("fz-node", seq=2 * n + 1, boot_id="fz", gpus=1, seconds=1, start=t0 + 2)
        before = count(engine, f"select count(*) from {table}")
        body, headers = protocol.encode(b)
        r = httpx.post(srv.url + "/api/v1/ingest", content=body, headers=headers, timeout=60)
        assert r.status_code < 500, r.text
        assert r.status_code == 200, r.text  # the GPU rows are always storable
        ans = r.json()
        expected = [i for i, rec in enumerate(records) if schema.record_problem(section, rec) is not None]
        assert [x["row"] for x in ans.get("refused", [])] == expected, (ans, records)
        assert ans["stored"] == b.n_rows()
        stored = count(engine, f"select count(*) from {table}") - before
        if section == "gpu_nics":  # upserted by (gpu, nic); a rail to an unknown GPU has no row
            assert stored <= len(records) - len(expected)
        else:
            assert stored == len(records) - len(expected)
        again = httpx.post(srv.url + "/api/v1/ingest", content=body, headers=headers, timeout=60)
        assert again.status_code == 200 and again.json()["duplicate"] is True, again.text
        assert count(engine, f"select count(*) from {table}") - before == stored  # nothing twice
        # the agent's spool: this batch (resent: a duplicate) and a good one behind it both leave
        for bb in (b, good):
            body2, headers2 = protocol.encode(bb)
            spool.put(body2, headers2, bb.idempotency_key, rows=bb.n_rows())
        outcomes = [sender.send_one() for _ in range(2)]
        assert all(o is not None and o[0].outcome is Outcome.SENT for o in outcomes), outcomes
        assert len(spool) == 0

    run()
    sender.close()
    engine.dispose()


LABEL_VALUE = st.one_of(st.integers(-(2**70), 2**70).map(str), st.sampled_from(["1e30", "-1", "nan", "", "0x10"]),
                        st.text(st.characters(blacklist_categories=("Cs",)), max_size=20),
                        st.sampled_from(["a\x00", "x" * 2000]))
SAMPLE_VALUE = st.one_of(st.floats(), st.sampled_from([math.nan, math.inf, -math.inf, 1e308, -1.0, 2.0**63]))


def test_remote_write_labels_and_values(database_url: str, live_server: Any) -> None:
    from tests.prometheus.captures import body
    from tests.prometheus.rwclient import post
    from tests.reliability.test_intake_receivers import _nccl_series

    srv = live_server(database_url)
    engine = make_engine(database_url)

    @FUZZ
    @given(gpu=LABEL_VALUE, uuid=LABEL_VALUE, host=LABEL_VALUE, value=SAMPLE_VALUE, rank=LABEL_VALUE,
           comm=LABEL_VALUE, ms=st.integers(-30_000, 0))
    def run(gpu: str, uuid: str, host: str, value: float, rank: str, comm: str, ms: int) -> None:
        t = int(NOW * 1000) - 60_000 + ms
        series = [({"__name__": "DCGM_FI_DEV_GPU_UTIL", "UUID": "GPU-" + uuid, "gpu": gpu, "Hostname": host},
                   [(t, value)])]
        series += _nccl_series(t, rank=rank, comm=comm)
        raw = body(series)
        r1 = post(srv.url, raw)
        assert r1.status_code < 500, r1.text
        rows = count(engine, "select count(*) from collective_windows")
        r2 = post(srv.url, raw)  # a retry of the very bytes
        assert r2.status_code < 500, r2.text
        assert count(engine, "select count(*) from collective_windows") == rows  # nothing twice

    run()
    engine.dispose()


IMPORT_LINE = st.fixed_dictionaries({
    "ts": st.one_of(st.floats(NOW - 3600, NOW), st.sampled_from([math.inf, -1.0, 1e300, 0.0])),
    "node": LABEL_VALUE, "gpu": st.one_of(st.integers(-(2**40), 2**40), st.just(0)),
    "job": st.one_of(st.none(), LABEL_VALUE), "sm_active": SAMPLE_VALUE,
})


def test_import_lines(sqlite_url: str, live_server: Any) -> None:
    srv = live_server(sqlite_url)

    @FUZZ
    @given(st.lists(IMPORT_LINE, min_size=1, max_size=5))
    def run(lines: list[dict[str, Any]]) -> None:
        data = "\n".join(json.dumps(x) for x in lines).encode()
        r = httpx.post(srv.url + "/api/v1/import", content=data, timeout=60)
        assert r.status_code < 500, r.text

    run()


def _datagram() -> st.SearchStrategy[Any]:
    num = st.one_of(st.floats(), st.integers(-(2**70), 2**70), st.sampled_from([time.monotonic(), 1.7e9]))
    ev = st.lists(st.one_of(num, st.sampled_from(["s", "b", "e", "v", "x"]), st.text(max_size=5), _json()),
                  max_size=5)
    header = st.fixed_dictionaries({
        "pid": st.one_of(st.integers(-5, 2**40), st.just(7)), "mono0": num, "wall0": st.one_of(num, st.just(NOW)),
        "now": num, "id": st.one_of(_json(), st.fixed_dictionaries({"job": LABEL_VALUE, "rank": num})),
        "meta": _json(), "dropped": num, "ev": st.lists(ev, max_size=8)})
    return st.one_of(header, _json())


def test_progress_relay_datagrams(tmp_path: Any) -> None:
    from gpufleet.agent.progress_relay import ProgressRelay

    path = f"/tmp/gpf-fz-{os.getpid()}.sock"
    relay = ProgressRelay(path, expire_s=3600, max_ready_bytes=1 << 20)
    try:
        @FUZZ
        @given(st.lists(_datagram(), min_size=1, max_size=10))
        def run(msgs: list[Any]) -> None:
            for m in msgs:
                relay._receive(json.dumps(m).encode())  # raises on any crash (the thread would only log it)
            with relay._lock:
                assert relay.ready_bytes <= relay.max_ready_bytes
            relay.drain(time.time() + 3600)

        run()
    finally:
        relay.close()
