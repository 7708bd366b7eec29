"""Hypothesis-generated malformed and hostile payloads: always a 4xx (or a 200 when the
mutation happens to be valid), never a 5xx, never a partial write."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from gpufleet.storage.raw_read import count_raw_samples

from .conftest import make_batch

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

hostile = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40), st.text(min_size=250, max_size=600),
    st.sampled_from(["\x00", "a\x00b", "\ud800", "GPU-" + "x" * 200, "", " "]),
    st.lists(st.integers(-5, 5), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)

PATHS = [
    ("agent", "boot_id"), ("agent", "seq"), ("agent", "node"), ("agent", "cluster"), ("agent", "version"),
    ("agent", "sent_at"), ("v",), ("gpus", 0, "index"), ("gpus", 0, "uuid"), ("gpus", 0, "memory_total_bytes"),
    ("gpus", 0, "mig_profile"), ("jobs", 0, "job_id"), ("jobs", 0, "user"), ("jobs", 0, "num_nodes"),
    ("jobs", 0, "start_ts"), ("jobs", 0, "labels"), ("jobs", 0, "source"), ("samples", "ts", 3),
    ("samples", "gpu", 5), ("samples", "job", 7), ("samples", "sm_active", 1), ("samples", "xid_last", 2),
    ("samples", "energy_j", 0), ("samples", "ts"), ("samples", "power_w"), ("samples", "not_a_field"),
    ("events",), ("allocations",), ("gpus",), ("samples",),
]


def _set(obj: Any, path: tuple[Any, ...], value: Any) -> None:
    for p in path[:-1]:
        obj = obj[p]
    last = path[-1]
    if isinstance(obj, list) and isinstance(last, int) and last >= len(obj):
        return
    obj[last] = value


def _totals(engine: Any) -> tuple[int, int, int, int]:
    with engine.connect() as c:
        rest = c.execute(text("select (select count(*) from ingest_batches), (select count(*) from jobs), "
                              "(select count(*) from events)")).one()
        return (count_raw_samples(c), *rest)  # type: ignore[return-value]


def _encode(doc: dict, fmt: str) -> tuple[bytes, dict[str, str]] | None:
    try:
        if fmt == "msgpack":
            return msgspec.msgpack.encode(doc), {"Content-Type": "application/msgpack"}
        return json.dumps(doc, allow_nan=True).encode("utf-8", "surrogatepass"), {"Content-Type": "application/json"}
    except (OverflowError, TypeError, ValueError):
        return None


@SETTINGS
@given(path=st.sampled_from(PATHS), value=hostile, fmt=st.sampled_from(["msgpack", "json"]), seq=st.integers(0, 10**6))
def test_hostile_values_never_5xx_never_partial(server, path, value, fmt, seq) -> None:
    srv, engine = server
    doc = msgspec.to_builtins(make_batch("h1", seq=seq, start=time.time() - 30, gpus=2, seconds=4))
    _set(doc, path, value)
    enc = _encode(doc, fmt)
    if enc is None:
        return
    before = _totals(engine)
    r = httpx.post(srv.url + "/api/v1/ingest", content=enc[0], headers=enc[1], timeout=30)
    assert r.status_code < 500, (path, value, r.status_code, r.text)
    after = _totals(engine)
    if r.status_code == 200:
        stored = r.json()["stored"]
        assert after[0] == before[0] + stored
    else:
        assert 400 <= r.status_code < 500 and r.json()["detail"]
        assert after == before, (path, value, r.text)


@SETTINGS
@given(body=st.binary(max_size=300), ctype=st.sampled_from(["application/msgpack", "application/json", None, "x/y"]),
       enc=st.sampled_from([None, "gzip", "zstd", "identity", "deflate"]))
def test_garbage_bodies_are_4xx(server, body, ctype, enc) -> None:
    srv, engine = server
    headers = {k: v for k, v in (("Content-Type", ctype), ("Content-Encoding", enc)) if v}
    before = _totals(engine)
    r = httpx.post(srv.url + "/api/v1/ingest", content=body, headers=headers, timeout=30)
    assert 400 <= r.status_code < 500, (body, headers, r.status_code, r.text)
    assert _totals(engine) == before


@SETTINGS
@given(path=st.sampled_from(PATHS), value=hostile, fmt=st.sampled_from(["msgpack", "json"]))
def test_fast_decode_agrees_with_generic_path(path, value, fmt) -> None:
    """The typed fast decoder accepts only what the generic decode + prepare accepts, and
    produces the same arrays."""
    import numpy as np

    from gpufleet import protocol
    from gpufleet.collector.columns import prepare
    from gpufleet.collector.errors import BatchRejected
    from gpufleet.collector.fastdecode import decode_prepared

    doc = msgspec.to_builtins(make_batch("h1", seq=1, start=1.79e9, gpus=2, seconds=4))
    _set(doc, path, value)
    enc = _encode(doc, fmt)
    if enc is None:
        return
    fast = decode_prepared(enc[0], enc[1]["Content-Type"])
    try:
        slow = prepare(protocol.decode(enc[0], enc[1]["Content-Type"]))
    except (protocol.ProtocolError, BatchRejected):
        slow = None
    if fast is None:
        return  # the generic path decides (and names the problem)
    assert slow is not None, (path, value)
    assert np.array_equal(fast.ts, slow.ts)
    assert np.array_equal(fast.vals, slow.vals, equal_nan=True)
    assert fast.gpu == slow.gpu and fast.job == slow.job and fast.key == slow.key
