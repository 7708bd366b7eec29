"""The packed (binary columns) form of a batch's samples: same rows stored as the list form,
structural and value errors named, hostile packed bodies never 5xx and never a partial write,
and the fast decoder accepting exactly what the generic path accepts."""

from __future__ import annotations

import math
import struct
import time
from typing import Any

import httpx
import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from gpufleet import protocol
from gpufleet.collector.columns import prepare
from gpufleet.collector.errors import BatchRejected
from gpufleet.collector.fastdecode import decode_prepared
from gpufleet.storage.raw_read import count_raw_samples, raw_records

from .conftest import make_batch

SETTINGS = settings(max_examples=80, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _with_nulls(b: protocol.Batch) -> protocol.Batch:
    """Some null cells, a row without a job: what the packed form must carry faithfully."""
    s = {k: list(v) for k, v in b.samples.items()}
    s["sm_active"][1] = None
    s["power_w"][0] = None
    s["job"][2] = None
    return msgspec.structs.replace(b, samples=s)


def test_pack_unpack_round_trip() -> None:
    b = _with_nulls(make_batch("p1", gpus=3, seconds=5))
    p = protocol.pack_samples(b.samples)
    assert p.n == 15 and len(p.gpus) == 3 and p.jobs == ["job-1"]
    back = protocol.unpack_samples(p)
    assert back.keys() == b.samples.keys()
    for k, col in b.samples.items():
        assert back[k] == [float(v) if isinstance(v, int) else v for v in col], k


def test_encode_sends_packed_and_decode_restores_lists() -> None:
    b = make_batch("p1", gpus=2, seconds=3)
    body, _ = protocol.encode(b, compress=None)
    raw = msgspec.msgpack.decode(body)
    assert "packed" in raw and not raw.get("samples")
    assert protocol.decode(body, protocol.MSGPACK).samples["gpu"] == b.samples["gpu"]
    lists, _ = protocol.encode(b, compress=None, packed=False)
    assert "packed" not in msgspec.msgpack.decode(lists)
    assert len(body) < len(lists)


def test_fast_and_generic_paths_give_the_same_arrays() -> None:
    b = _with_nulls(make_batch("p1", gpus=4, seconds=10))
    body, _ = protocol.encode(b, compress=None)
    fast = decode_prepared(body, protocol.MSGPACK)
    slow = prepare(protocol.decode(body, protocol.MSGPACK))
    lists = prepare(b)
    assert fast is not None
    for other in (slow, lists):
        assert np.array_equal(fast.ts, other.ts)
        assert np.array_equal(fast.vals, other.vals, equal_nan=True)
        assert fast.gpu == other.gpu and fast.job == other.job and fast.key == other.key


def _doc(b: protocol.Batch) -> dict[str, Any]:
    return msgspec.to_builtins(msgspec.structs.replace(b, samples={}, packed=protocol.pack_samples(b.samples)),
                               builtin_types=(bytes,))  # type: ignore[no-any-return]


def _post(url: str, doc: dict[str, Any]) -> httpx.Response:
    return httpx.post(url + "/api/v1/ingest", content=msgspec.msgpack.encode(doc),
                      headers={"Content-Type": protocol.MSGPACK}, timeout=30)


def _rows(engine: Any, node: str) -> list[tuple[Any, ...]]:
    with engine.connect() as c:
        gpus = dict(c.execute(text("select g.id, g.\"index\" from gpus g join nodes n on n.id = g.node_id "
                                   "where n.name = :n"), {"n": node}).all())
        jobs = dict(c.execute(text("select id, job_id from jobs")).all())
        rows = [(r["ts"], gpus[r["gpu_pk"]], jobs.get(r["job_pk"]), r["sm_active"], r["power_w"], r["xid_last"],
                 r["energy_j"]) for r in raw_records(c, gpu_pks=list(gpus))]
        return sorted(rows, key=lambda r: (r[0], r[1]))


def test_packed_and_list_forms_store_the_same_rows(server) -> None:  # type: ignore[no-untyped-def]
    srv, engine = server
    start = time.time() - 60
    packed = _with_nulls(make_batch("pk-a", start=start, seed=3))
    lists = _with_nulls(make_batch("pk-b", start=start, seed=3))
    body, headers = protocol.encode(packed, compress="zstd")
    r1 = httpx.post(srv.url + "/api/v1/ingest", content=body, headers=headers, timeout=30)
    body, headers = protocol.encode(lists, compress="zstd", packed=False)
    r2 = httpx.post(srv.url + "/api/v1/ingest", content=body, headers=headers, timeout=30)
    assert r1.status_code == r2.status_code == 200, (r1.text, r2.text)
    assert r1.json()["stored"] == r2.json()["stored"] == 80
    a, b = _rows(engine, "pk-a"), _rows(engine, "pk-b")
    assert len(a) == 80 and a == b
    assert any(row[3] is None for row in a) and any(row[2] is None for row in a)


@pytest.mark.parametrize(("mutate", "status", "words"), [
    (lambda d: d["packed"].update(ts=d["packed"]["ts"][:-8]), 400, "packed.ts"),
    (lambda d: d["packed"].update(gpu=struct.pack("<H", 9) + d["packed"]["gpu"][2:]), 400, "packed.gpu[0]"),
    (lambda d: d["packed"].update(job=struct.pack("<i", 5) + d["packed"]["job"][4:]), 400, "packed.job[0]"),
    (lambda d: d["packed"].update(fields=d["packed"]["fields"][:1] * 2, values=d["packed"]["values"][:2 * 8 * 80]),
     400, "listed twice"),
    (lambda d: d["packed"].update(values=d["packed"]["values"][:-1]), 400, "packed.values"),
    (lambda d: d.update(samples={"ts": [1.0]}), 400, "not both"),
])
def test_structural_errors_are_named_and_store_nothing(server, mutate, status, words) -> None:  # type: ignore[no-untyped-def]
    srv, engine = server
    doc = _doc(make_batch("pk-bad", start=time.time() - 60))
    mutate(doc)
    r = _post(srv.url, doc)
    assert r.status_code == status and words in r.json()["detail"], r.text
    assert _rows(engine, "pk-bad") == []


def test_value_out_of_range_names_field_and_row(server) -> None:  # type: ignore[no-untyped-def]
    srv, engine = server
    b = make_batch("pk-range", start=time.time() - 60)
    s = {k: list(v) for k, v in b.samples.items()}
    s["sm_active"][3] = 1.5
    r = _post(srv.url, _doc(msgspec.structs.replace(b, samples=s)))
    assert r.status_code == 422 and "samples.sm_active[3]" in r.json()["detail"], r.text
    s["sm_active"][3] = math.inf
    r = _post(srv.url, _doc(msgspec.structs.replace(b, samples=s)))
    assert r.status_code == 422 and "sm_active[3]" in r.json()["detail"], r.text
    assert _rows(engine, "pk-range") == []


@pytest.mark.parametrize(("value", "ok"), [(2.0, True), (0.0, True), (-0.0, True), (999_999.0, True),
                                         (math.nan, True), (2.5, False), (1e-9, False), (999_998.5, False),
                                         (1e6 + 0.5, False), (-1.0, False)])
def test_integer_fields_must_be_whole(value: float, ok: bool) -> None:
    """The packed fast path's value rule (field_bounds_ok) on integer fields: a fraction is
    refused, so is a value out of range, a whole number or NaN ("not available") passes."""
    from gpufleet.collector.columns import field_bounds, field_bounds_ok
    from gpufleet.storage.fields import FIELD_INDEX

    idx = np.array([FIELD_INDEX[f] for f in ("sm_active", "xid_last", "pcie_replay_count")])
    mat = np.array([[0.5] * 4, [13.0] * 4, [1.0] * 4])
    assert field_bounds_ok(mat, field_bounds(idx))
    for row in (1, 2):
        m = mat.copy()
        m[row, 2] = value
        assert field_bounds_ok(m, field_bounds(idx)) is ok, (row, value)


# --- hostile packed bodies ----------------------------------------------------------------

_PART = st.sampled_from(["n", "ts", "gpus", "gpu", "fields", "values", "jobs", "job"])
_hostile = st.one_of(
    st.none(), st.integers(-(2**63), 2**64 - 1), st.binary(max_size=64), st.text(max_size=20),
    st.lists(st.text(max_size=100), max_size=4), st.lists(st.integers(-3, 3), max_size=3),
    st.sampled_from([b"\x00" * 8 * 80, b"\xff" * 2 * 80, b"\x7f\xf0" + b"\x00" * 6, ["sm_active", "sm_active"],
                     ["ts"], ["nope"], [], 0, -1, 10**9, "GPU-" + "x" * 200, ["\x00"], ["\ud800"]]),
)


def _float_bytes(data: Any) -> bytes:
    return struct.pack("<d", data) if isinstance(data, float) else b""


@SETTINGS
@given(part=_PART, value=_hostile, row=st.integers(0, 79), special=st.sampled_from(
    [math.nan, math.inf, -1.0, 1e300, 0.5, -0.0]))
def test_hostile_packed_never_5xx_never_partial(server, part, value, row, special) -> None:  # type: ignore[no-untyped-def]
    srv, engine = server
    doc = _doc(make_batch("pk-h", seq=row, start=time.time() - 60, gpus=8, seconds=10))
    if isinstance(value, bytes) and part in ("values", "ts") and len(value) == 0:
        # a special float at one row of a column instead of an empty column
        key = "values" if part == "values" else "ts"
        buf = bytearray(doc["packed"][key])
        buf[row * 8:row * 8 + 8] = _float_bytes(special)
        value = bytes(buf)
    doc["packed"][part] = value
    try:
        body = msgspec.msgpack.encode(doc)
    except (UnicodeEncodeError, OverflowError):
        return  # not representable in msgpack (a lone surrogate): nothing to send
    with engine.connect() as c:
        before = count_raw_samples(c)
    r = httpx.post(srv.url + "/api/v1/ingest", content=body, headers={"Content-Type": protocol.MSGPACK}, timeout=30)
    assert r.status_code < 500, (part, value, r.text)
    with engine.connect() as c:
        after = count_raw_samples(c)
    if r.status_code == 200:
        assert after == before + r.json()["stored"]
    else:
        assert r.json()["detail"] and after == before, (part, value, r.text)

    # The fast decoder accepts only what the generic path accepts, with the same arrays, and
    # refuses a broken packed structure with the generic path's error (one check_packed).
    try:
        fast = decode_prepared(body, protocol.MSGPACK)
    except protocol.ProtocolError as e:
        with pytest.raises(protocol.ProtocolError) as slow_err:
            protocol.decode(body, protocol.MSGPACK)
        assert str(slow_err.value) == str(e) and slow_err.value.kind == e.kind
        return
    if fast is None:
        return
    try:
        slow = prepare(protocol.decode(body, protocol.MSGPACK))
    except (protocol.ProtocolError, BatchRejected) as e:
        raise AssertionError(f"fast path accepted what the generic path rejects: {e}") from None
    assert np.array_equal(fast.ts, slow.ts) and np.array_equal(fast.vals, slow.vals, equal_nan=True)
    assert fast.gpu == slow.gpu and fast.job == slow.job


# --- the fast path's cached gpus/jobs checks reject exactly what check_batch rejects ------

_DIM_PATHS = [("gpus", 0, "uuid"), ("gpus", 0, "model"), ("gpus", 0, "index"), ("gpus", 0, "mig_profile"),
              ("gpus", 0, "parent_uuid"), ("gpus", 0, "memory_total_bytes"), ("gpus", 1, "uuid"),
              ("jobs", 0, "job_id"), ("jobs", 0, "user"), ("jobs", 0, "name"), ("jobs", 0, "num_nodes"),
              ("jobs", 0, "ntasks"), ("jobs", 0, "start_ts"), ("jobs", 0, "labels"), ("gpus",), ("jobs",)]
_dim_values = st.one_of(
    st.none(), st.integers(-(2**40), 2**40), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20), st.text(min_size=90, max_size=600),
    st.sampled_from(["\x00", "a\x00b", "", " ", "GPU-" + "x" * 93, "GPU-" + "x" * 92, 4.1e9, 65535, 65536, -1,
                     {"k": "v"}, {"": "v"}, {"k": "x" * 1025}, {f"k{i}": "v" for i in range(65)}, 1e15, 1e16]),
)


@SETTINGS
@given(path=st.sampled_from(_DIM_PATHS), value=_dim_values, packed=st.booleans(), again=st.booleans())
def test_fast_path_checks_accept_exactly_what_check_batch_accepts(path, value, packed, again) -> None:
    from gpufleet.collector.validate import check_batch

    now = time.time()
    b = make_batch("pk-dims", start=now - 60, gpus=2, seconds=2)
    doc = _doc(b) if packed else msgspec.to_builtins(b)
    target = doc
    for p in path[:-1]:
        target = target[p]
    target[path[-1]] = value
    try:
        body = msgspec.msgpack.encode(doc)
    except (UnicodeEncodeError, OverflowError, TypeError):
        return

    def verdict(fast: bool) -> str:
        try:
            if fast:
                prep = decode_prepared(body, protocol.MSGPACK)
                if prep is None:
                    return "generic"
            else:
                prep = prepare(protocol.decode(body, protocol.MSGPACK))
            check_batch(prep.batch, prep, now, max_rows=20_000, max_age_s=30 * 86400, max_future_s=300,
                        dims_checked=fast)
            return "ok"
        except (protocol.ProtocolError, BatchRejected):
            return "rejected"

    generic = verdict(False)
    fast = verdict(True)
    if again:  # the second time the lists come from the cache
        fast = verdict(True)
    assert fast in ("generic", generic), (path, value, fast, generic)


# --- the optional sections (progress, collectives, nics, gpu_nics) on the fast path -------

def _sections(b: protocol.Batch, t: float, *, collectives: bool = True) -> dict[str, Any]:
    """What a real agent adds to a flush: one sample per NIC (8 ports, one rail per GPU), the
    rails, one progress window per rank of the job and (with the NCCL Inspector) collectives."""
    gpus = [g.uuid for g in b.gpus]
    job = b.jobs[0].job_id if b.jobs else "job-1"
    out: dict[str, Any] = {
        "nics": [protocol.NicSample(ts=t, nic=f"mlx5_{i}/1", interval_s=10.0, link_layer="InfiniBand",
                                    state="ACTIVE", rate_gbps=400.0, tx_bytes_s=1.2e10 + i, rx_bytes_s=1.1e10,
                                    counters={"port_xmit_wait": 2.0e7, "symbol_error": 0.0, "link_downed": 0.0})
                 for i in range(len(gpus))],
        "gpu_nics": [protocol.GpuNic(gpu_uuid=u, nic=f"mlx5_{i}/1", mode="pcie") for i, u in enumerate(gpus)],
        "progress": [protocol.ProgressWindow(
            job_id=job, rank=r, pid=4000 + r, start=t - 10, end=t, world_size=len(gpus), local_rank=r, gpu=u,
            host=b.agent.node, steps=21, first_step=10401, last_step=10421, max_step=10421, tokens=86016,
            samples=84, productive_s=8.9, spans={"data_wait": 1.1}, span_counts={"data_wait": 21},
            step_time_p50_s=0.42, step_time_p95_s=0.45, step_time_max_s=0.47, step_hist={"-9": 18, "-8": 3},
            last_step_ts=t - 0.2, since_step_s=0.2, flops_per_step=4.1e15) for r, u in enumerate(gpus)],
    }
    if collectives:
        out["collectives"] = [protocol.CollectiveAgg(
            ts=t - 10, comm="0x7f8c496ae9f661", rank=r, coll="AllReduce", size_bucket=1 << 28, count=10,
            bytes=2.68e9, exec_us_p50=3263.0, exec_us_p95=3410.0, exec_us_max=3502.0, busbw_gbs_p50=159.4,
            job_id=job, n_ranks=32, n_nodes=4, gpu_uuid=u, pid=4000 + r, timing_source="kernel_gpu")
            for r, u in enumerate(gpus)]
    return out


def _with_sections(b: protocol.Batch, **kw: Any) -> protocol.Batch:
    return msgspec.structs.replace(b, **_sections(b, b.samples["ts"][-1], **kw))


def _no_samples(b: protocol.Batch) -> dict[str, Any]:
    return msgspec.to_builtins(msgspec.structs.replace(b, samples={}))  # type: ignore[no-any-return]


_SECTION_PATHS = [None, ("nics", 0, "ts"), ("nics", 0, "nic"), ("nics", 0, "interval_s"), ("nics", 0, "rate_gbps"),
                  ("nics", 0, "tx_bytes_s"), ("nics", 0, "counters"), ("nics", 0, "state"), ("nics", 0, "extra"),
                  ("gpu_nics", 0, "mode"), ("gpu_nics", 0, "nic"), ("gpu_nics", 0, "gpu_uuid"),
                  ("progress", 0, "start"), ("progress", 0, "steps"), ("progress", 0, "stall_s"),
                  ("progress", 0, "spans"), ("progress", 0, "events"), ("progress", 0, "job_id"),
                  ("progress", 0, "rank"), ("progress", 0, "step_hist"), ("collectives", 0, "ts"),
                  ("collectives", 0, "window_s"), ("collectives", 0, "count"), ("collectives", 0, "exec_us_p50"),
                  ("collectives", 0, "comm"), ("collectives", 0, "job_id"), ("collectives", 0, "rank"),
                  ("nics",), ("gpu_nics",), ("progress",), ("collectives",)]
_section_values = st.one_of(
    st.none(), st.integers(-(2**40), 2**40), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=70),
    st.sampled_from([-1, 0, 1, 0.5, 5.0, 3600.0, 3600.5, 86401.0, 1e7, 4.2e9, "", "x" * 65, "x" * 256, "guess",
                     "pcie", "numa", {"symbol_error": -1.0}, {"k": math.nan}, {"data_wait": -0.5},
                     {f"s{i}": 1.0 for i in range(65)}, [{}] * 101, [{}], [], [[]], {"": 1}]),
)


@SETTINGS
@given(path=st.sampled_from(_SECTION_PATHS), value=_section_values, form=st.sampled_from(["packed", "lists", "none"]),
       collectives=st.booleans())
def test_sections_take_the_fast_path_and_are_checked_exactly_as_on_the_generic_path(
        path, value, form, collectives) -> None:  # type: ignore[no-untyped-def]
    """A batch carrying the optional sections, valid or not, in each samples form: the fast
    path accepts exactly what the generic path accepts (and takes every valid one itself),
    refuses with the same message when it refuses, and hands on the same sections."""
    from gpufleet.collector.validate import check_batch

    now = time.time()
    collectives = collectives or (path is not None and path[0] == "collectives")  # omitted when empty
    b = _with_sections(make_batch("pk-sec", start=now - 60, gpus=2, seconds=3), collectives=collectives)
    doc = {"packed": _doc, "lists": msgspec.to_builtins, "none": _no_samples}[form](b)
    if path is not None:
        target = doc
        for p in path[:-1]:
            target = target[p]
        target[path[-1]] = value
    try:
        body = msgspec.msgpack.encode(doc)
    except (UnicodeEncodeError, OverflowError, TypeError):
        return

    def verdict(fast: bool) -> tuple[str, str, Any]:
        try:
            if fast:
                prep = decode_prepared(body, protocol.MSGPACK)
                if prep is None:
                    return "generic", "", None
            else:
                prep = prepare(protocol.decode(body, protocol.MSGPACK))
            check_batch(prep.batch, prep, now, max_rows=20_000, max_age_s=30 * 86400, max_future_s=300,
                        dims_checked=fast)
            return "ok", "", prep
        except protocol.ProtocolError as e:
            return "rejected", str(e), None
        except BatchRejected as e:
            return "rejected", e.detail, None

    generic, generic_detail, slow = verdict(False)
    fast, fast_detail, quick = verdict(True)
    if generic == "ok":
        assert fast == "ok", (path, value, form, "a valid batch with sections fell back to the generic path")
        for name in ("progress", "collectives", "nics", "gpu_nics", "events", "allocations", "gpus", "jobs"):
            assert msgspec.to_builtins(getattr(quick.batch, name)) == msgspec.to_builtins(getattr(slow.batch, name))
        assert np.array_equal(quick.ts, slow.ts) and np.array_equal(quick.vals, slow.vals, equal_nan=True)
        assert quick.gpu == slow.gpu and quick.job == slow.job
    else:
        assert fast in ("generic", "rejected"), (path, value, form, fast, generic_detail)
        if fast == "rejected":
            assert fast_detail == generic_detail, (path, value, form)


def test_section_checks_run_once_on_each_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The intake schema's screen runs in check_batch, once, whichever decoder produced the
    batch (the decoders check only the sections' types)."""
    from gpufleet.collector import validate

    calls: list[str] = []
    real = validate.intake_schema.screen
    monkeypatch.setattr(validate.intake_schema, "screen", lambda batch: (calls.append("fabric"), real(batch))[1])
    now = time.time()
    body, _ = protocol.encode(_with_sections(make_batch("pk-once", start=now - 60)), compress=None)
    for fast in (True, False):
        prep = decode_prepared(body, protocol.MSGPACK) if fast else prepare(protocol.decode(body, protocol.MSGPACK))
        assert prep is not None and calls == [], "a decoder ran the fabric check"
        validate.check_batch(prep.batch, prep, now, max_rows=20_000, max_age_s=30 * 86400, max_future_s=300,
                             dims_checked=fast)
        assert calls == ["fabric"], (fast, calls)
        calls.clear()


_FK = {"cluster_id": ("clusters", "name"), "node_id": ("nodes", "name"), "gpu_pk": ("gpus", "uuid"),
       "job_pk": ("jobs", "job_id")}
_TABLES = ["nodes", "gpus", "jobs", "allocations", "events", "raw_samples", "gpu_samples_1m", "job_samples_1m",
           "job_progress", "nic_samples", "gpu_nics", "collective_windows"]


def _snapshot(c: Any) -> dict[str, list[str]]:
    """Every stored row of the tables a batch touches, ids replaced by the names they stand
    for (PostgreSQL sequences do not roll back), in a stable order."""
    names = {col: dict(c.execute(text(f"select id, {key} from {table}")).all()) for col, (table, key) in _FK.items()}
    out = {}
    for table in _TABLES:
        rows = []
        # raw samples are blocks: compared decoded, one record per sample
        records = raw_records(c) if table == "raw_samples" else c.execute(text(f"select * from {table}")).mappings()
        for r in records:
            rows.append(repr(sorted((k, names[k].get(v) if k in names else v) for k, v in r.items() if k != "id")))
        out[table] = sorted(rows)
    return out


def test_agent_batch_with_nics_and_progress_takes_the_fast_path_and_stores_the_same(engine) -> None:  # type: ignore[no-untyped-def]
    """What an agent sends by default (packed, zstd) with NIC health and a training job's
    progress windows: decoded by the fast path, and stored row for row as the generic path
    stores it, on SQLite and PostgreSQL."""
    from gpufleet.collector.validate import check_batch
    from gpufleet.storage import retention
    from gpufleet.storage.writes import write_batches

    now = time.time()
    b = _with_sections(make_batch("pk-agent", start=now - 60, gpus=8, seconds=10), collectives=False)
    body, headers = protocol.encode(b)
    raw = protocol.decompress(body, headers.get("Content-Encoding"), max_size=8 << 20)
    fast = decode_prepared(raw, headers["Content-Type"])
    assert fast is not None, "the agent's batch fell back to the generic decoder"
    slow = prepare(protocol.decode(raw, headers["Content-Type"]))
    retention.ensure_partitions(engine, retention.days_of(fast.ts))  # committed: each write below rolls back
    snaps = []
    for prep, dims in ((fast, True), (slow, False)):
        check_batch(prep.batch, prep, now, max_rows=20_000, max_age_s=30 * 86400, max_future_s=300, dims_checked=dims)
        with engine.connect() as c:
            tx = c.begin()
            res = write_batches(c, [prep], now)
            snaps.append((res.stored, _snapshot(c)))
            tx.rollback()
    assert snaps[0] == snaps[1]
    stored, rows = snaps[0]
    assert stored == 80 and len(rows["raw_samples"]) == 80
    assert len(rows["nic_samples"]) == len(rows["gpu_nics"]) == len(rows["job_progress"]) == 8
