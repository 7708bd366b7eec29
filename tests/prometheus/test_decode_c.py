"""The optional C decoder (collector/remote_write/_decode_c.c) against the Python decoder it
stands in for (wire.decode(native=False), itself checked against the protobuf library in
test_wire.py): the same series, samples (value bits included), histograms and metadata on real
and random bodies, and on broken bodies the same refusal with the same message, or None (the
Python decoder's turn) where the C pass says so. Where a C compiler and the Python headers are
here, not built is a failure, not a skip."""

from __future__ import annotations

import random
import shutil
import struct
import sysconfig
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.collector.remote_write import wire
from gpufleet.protocol import ProtocolError
from tests.prometheus.captures import DUMPS, body, capture_series
from tests.prometheus.test_wire import _random_request

NOW = time.time()
T0 = int(NOW * 1000) - 60_000


def _native() -> None:
    if wire._NATIVE is None:
        # Where it can be built, not built is a broken install, not a skip: the receiver would
        # silently take the slow path (pip install -e . or setup.py build_ext --inplace builds it).
        header = Path(sysconfig.get_paths()["include"]) / "Python.h"
        assert not (shutil.which("cc") and header.exists()), \
            "a C compiler is here but the remote-write C decoder is not built: pip install -e . (or build_ext)"
        pytest.skip("no C compiler here: the Python decoder reads every body")


@pytest.fixture(autouse=True)
def native() -> None:
    _native()


def _bits(v: float) -> bytes:
    return struct.pack("<d", v)


def _as_tuple(req: wire.WriteRequest) -> tuple[object, ...]:
    """A request with each value as its bits (NaN payloads, -0.0), comparable with ==."""
    return (tuple((s.key, tuple((t, _bits(v)) for t, v in s.samples), s.histograms) for s in req.series),
            tuple(req.metadata.items()))


def _outcome(fn: object) -> tuple[str, object]:
    try:
        got = fn()  # type: ignore[operator]
    except ProtocolError as e:
        return "refused", str(e)
    return "read", _as_tuple(got) if got is not None else None


def _c(raw: bytes) -> tuple[str, object]:
    """The C pass alone: ("read", request), ("refused", message) or ("python", None)."""
    try:
        s = wire.scan(raw)
    except ProtocolError as e:
        return "refused", str(e)
    if s is None:
        return "python", None
    assert len(s.first) == len(s.keys) + 1 and len(s.histograms) == len(s.keys) and len(s.ts_ms) == len(s.values)
    return "read", _as_tuple(s.request())


def _py(raw: bytes) -> tuple[str, object]:
    return _outcome(lambda: wire.decode(raw, native=False))


# --- valid bodies ---------------------------------------------------------------------------

def test_the_real_captures_read_as_the_python_decoder_reads_them() -> None:
    """dcgm-exporter's captures as Prometheus sends them: one sample per series (the columnar
    path's case, where the C columns are the Python scan's exactly), several samples, with
    metadata beside them, and NaN / staleness / negative-time samples."""
    stale = float.fromhex("0x7ff0000000000002")
    for name in DUMPS:
        series = capture_series(name, instance="node-a:9400", job="dcgm")
        one = body([(lab, [(T0, v)]) for lab, v, _ in series])
        c = wire.scan(one)
        assert c is not None and c.single and _c(one) == _py(one)
        cols, ref = c.single_samples(), wire.scan_single_samples(one, None, native=False)
        assert cols is not None and ref is not None
        assert cols.keys == ref.keys and cols.ts_ms.tolist() == ref.ts_ms.tolist()
        assert cols.values.tobytes() == ref.values.tobytes()
        assert cols.ts_ms.dtype == np.int64 and cols.values.dtype == np.float64
        assert wire.scan_single_samples(one, {k for k in cols.keys}) is not None
        assert wire.scan_single_samples(one, set(cols.keys[1:])) is None  # one key unknown
        many = body([(lab, [(T0 + 15_000 * k, v if k != 2 else stale) for k in range(4)] + [(-5, -0.0), (0, 0.0)])
                     for lab, v, _ in series], [(lab["__name__"], 1 + i % 5) for i, (lab, _, _) in enumerate(series)])
        c = wire.scan(many)
        assert c is not None and not c.single and c.single_samples() is None and c.metadata
        assert _c(many) == _py(many)
        assert wire.scan_single_samples(many, None) is None


def _put(out: bytearray, tag: int, data: bytes) -> None:
    wire.put_varint(out, tag)
    wire.put_varint(out, len(data))
    out += data


_UNKNOWN = st.sampled_from([b"\x28\x05", b"\x31" + b"\x00" * 8, b"\x3a\x02ab", b"\x3d\x01\x02\x03\x04",
                            b"\x28\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"])  # fields 5-7, each wire type
_VALUE = st.one_of(st.floats(allow_nan=True), st.sampled_from([0.0, -0.0, float.fromhex("0x7ff0000000000002")]))
_TS = st.one_of(st.integers(-(1 << 63), (1 << 63) - 1), st.sampled_from([0, -1, 1 << 35, (1 << 42) - 1]))


@st.composite
def _sample(draw: st.DrawFn) -> bytes:
    """A Sample's fields in any order, a zero left out (proto3), repeated (the last wins) or
    beside an unknown field."""
    parts = []
    for _ in range(draw(st.integers(0, 2))):
        parts.append(b"\x09" + _bits(draw(_VALUE)))
    for _ in range(draw(st.integers(0, 2))):
        ts = bytearray(b"\x10")
        wire.put_varint(ts, draw(_TS))
        parts.append(bytes(ts))
    if draw(st.booleans()):
        parts.append(draw(_UNKNOWN))
    return b"".join(draw(st.permutations(parts)))


@st.composite
def _body(draw: st.DrawFn) -> bytes:
    out = bytearray()
    for _ in range(draw(st.integers(0, 12))):
        labels = st.lists(st.tuples(st.sampled_from(["__name__", "UUID", "gpu", "x" * 150]), st.text(max_size=140)),
                          max_size=5, unique_by=lambda t: t[0])
        ts = bytearray(wire.encode_labels(draw(labels)))
        for _ in range(draw(st.integers(0, 4))):
            _put(ts, 0x12, draw(_sample()))
        for _ in range(draw(st.integers(0, 1))):
            _put(ts, 0x22, b"\x08\x01\x10\x02")  # a native histogram: counted
        if draw(st.booleans()):
            ts += draw(_UNKNOWN)
        _put(out, 0x0A, bytes(ts))
        if draw(st.integers(0, 9)) == 0:
            out += draw(_UNKNOWN)
        if draw(st.integers(0, 9)) == 0:
            m = bytearray()
            m += b"\x08" + bytes([draw(st.integers(0, 7))])
            _put(m, 0x12, draw(st.sampled_from([b"DCGM_FI_DEV_GPU_UTIL", b"m", b"", b"\xff\xfe"])))
            _put(m, 0x22, b"help")
            _put(out, 0x1A, bytes(m))
    return bytes(out)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_body())
def test_random_valid_bodies_read_as_the_python_decoder_reads_them(raw: bytes) -> None:
    got = _c(raw)
    assert got[0] == "read", got
    assert got == _py(raw)
    s = wire.scan(raw)
    assert s is not None
    if s.single_samples() is not None:
        assert all(len(x.samples) == 1 and not x.histograms for x in s.request().series) and not s.metadata


def test_the_c_pass_leaves_what_it_does_not_cover_to_python() -> None:
    """A label after a series' samples (legal; its key is two slices), a length of 2**48 and a
    timestamp varint of 2**64 or more: None, and decode still reads (or refuses) them."""
    lab = wire.encode_labels([("__name__", "m")])
    late = bytearray(lab)
    _put(late, 0x12, b"\x09" + _bits(1.0) + b"\x10\x05")
    late += wire.encode_labels([("z", "1")])
    raw = bytearray()
    _put(raw, 0x0A, bytes(late))
    assert wire.scan(bytes(raw)) is None
    got = wire.decode(bytes(raw))
    assert got.series[0].key == lab + wire.encode_labels([("z", "1")]) and got.series[0].samples == [(5, 1.0)]
    huge = b"\x0a\x80\x80\x80\x80\x80\x80\x40"  # a series of 2**48 bytes
    assert wire.scan(huge) is None and _py(huge)[0] == "refused"
    with pytest.raises(ProtocolError, match="runs past the end"):
        wire.decode(huge)
    big_ts = bytearray(lab)
    _put(big_ts, 0x12, b"\x10" + b"\xff" * 9 + b"\x03")  # 2**64 + ...: Python keeps the big int
    raw = bytearray()
    _put(raw, 0x0A, bytes(big_ts))
    assert wire.scan(bytes(raw)) is None
    assert wire.decode(bytes(raw)).series[0].samples == [((1 << 64) - 1, 0.0)]  # (2**65 - 1) - 2**64


# --- broken bodies --------------------------------------------------------------------------

_BROKEN = [
    (b"\x0f\x00", "unsupported protobuf wire type 7 at offset 1"),
    (b"\x0a\x05\x0a", "timeseries at offset 2 runs past the end of the body"),
    (b"\x0a", "truncated"),
    (b"\x0a\x80", "truncated"),
    (b"\x0a\x80\x80", "truncated varint at offset 3"),
    (b"\x0a\x80\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01", "varint longer than 10 bytes at offset 11"),
    (b"\x0a\x03\x0a\x05\x00", "timeseries ending at offset 5 is malformed"),  # a label past its series
    (b"\x0a\x02\x12\x09", "truncated"),  # a sample's first field past the body
    (b"\x0a\x04\x12\x02\x09\x00", "truncated inside a sample value"),
    (b"\x0a\x0a\x12\x08\x09" + b"\x00" * 7, "truncated inside a sample value"),  # 7 of its 8 bytes, the last at the end
    (b"\x0a\x03\x12\x01\x10", "truncated varint at offset 5"),
    (b"\x0a\x04\x12\x02\x10\x01\x0d", "protobuf body ends inside a field"),  # a fixed32 past the end
    (b"\x0a\x04\x12\x02\x10\x01\x00", "truncated varint at offset 7"),
    (b"\x0a\x04\x12\x02\x0f\x00", "unsupported protobuf wire type 7 at offset 5"),
    (b"\x0a\x02\x1f\x00", "unsupported protobuf wire type 7 at offset 3"),  # in a series
    (b"\x0a\x03\x12\x01\x10\x01", "sample ending at offset 5 is malformed"),
    (b"\x1a\x02\x0f\x00", "unsupported protobuf wire type 7 at offset 3"),  # in metadata
    (b"\x1a\x05\x08", "truncated varint at offset 3"),
    (b"\x1a\x01\x08\x01", "protobuf body ends inside a field"),
    (b"\x09\x00\x00", "protobuf body ends inside a field"),  # an unknown fixed64 past the end
    (b"\x80", "truncated varint at offset 1"),
]


@pytest.mark.parametrize(("raw", "message"), _BROKEN)
def test_broken_bodies_are_refused_with_the_python_decoders_message(raw: bytes, message: str) -> None:
    ref = _py(raw)
    assert ref[0] == "refused"
    assert _c(raw) == ref
    assert ref[1] == f"malformed WriteRequest protobuf: {message}"
    assert wire.scan_single_samples(raw, None) is None


def _corrupt(rng: random.Random, raw: bytes) -> bytes:
    b = bytearray(raw)
    for _ in range(rng.randint(1, 3)):
        if not b:
            break
        i = rng.randrange(len(b))
        op = rng.random()
        if op < 0.4:
            b[i] ^= 1 << rng.randrange(8)
        elif op < 0.55:
            del b[i:]
        elif op < 0.8:
            b[i] = rng.choice([0x0A, 0x12, 0x1A, 0x22, 0x80, 0xFF, 0x09, 0x10, 0x0B, 0x0F, 0x00])
        else:
            b[i:i] = bytes([rng.randrange(256)])
    return bytes(b)


def test_every_truncation_and_random_corruption_gets_the_python_decoders_answer() -> None:
    """Every cut of protobuf-library bodies and of a real capture's body, and seeded bit flips,
    byte swaps and insertions: the C pass reads what Python reads, refuses what it refuses with
    the same message (the same first fault), or hands the body over; never crashes or reads out
    of bounds (every read is against the body's end)."""
    rng = random.Random(20261204)
    real = body([(lab, [(T0, v)]) for lab, v, _ in capture_series(DUMPS[0], instance="a:9400")][:40],
                [("DCGM_FI_DEV_GPU_UTIL", 1)])
    bodies = [real, *(_random_request(rng).SerializeToString() for _ in range(40))]
    cases = [b[:cut] for b in bodies[:6] for cut in range(len(b))]
    cases += [_corrupt(rng, rng.choice(bodies)) for _ in range(6000)]
    handed = refused = 0
    for raw in cases:
        got, ref = _c(raw), _py(raw)
        if got[0] == "python":
            handed += 1
            continue
        assert got == ref, raw.hex()
        refused += got[0] == "refused"
        # the receiver's routing: columns only for what the Python decoder reads
        if wire.scan_single_samples(raw, None) is not None:
            assert ref[0] == "read"
    assert refused > len(cases) // 3 and handed < len(cases) // 50, (refused, handed, len(cases))


# --- the receiver ---------------------------------------------------------------------------

def test_the_receiver_answers_the_same_with_and_without_the_c_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """Receiver._parse over steady-state bodies (the columnar path: with the C pass, samples of
    any byte layout, here zero values left out and old timestamps, take it) and over bodies the
    general path converts: the same batches, rows and counts either way."""
    from gpufleet.collector.remote_write.receiver import Receiver
    from gpufleet.pod_jobs import DEFAULT_PATTERNS

    coll = SimpleNamespace(config=SimpleNamespace(max_age_s=30 * 86400.0, max_future_s=300.0,
                                                  kubernetes_job_patterns=DEFAULT_PATTERNS),
                           settings=SimpleNamespace(http=SimpleNamespace(max_rows_per_batch=20_000)))
    sends = []
    for k in range(3):
        series = []
        for name in DUMPS:
            for i, (lab, v, _) in enumerate(capture_series(name, instance=f"{name[:5]}:9400")):
                series.append((lab, [(T0 + 15_000 * k, 0.0 if i % 3 == 0 else v)]))
        sends.append(wire.snappy(body(series)))
    sends.append(wire.snappy(body([(lab, [(T0 + 60_000, v), (T0 + 75_000, v)])
                                   for lab, v, _ in capture_series(DUMPS[1], instance="x:9400")])))
    sends.append(wire.snappy(b"\x0a\x05\x0a"))

    def run() -> list[object]:
        rec = Receiver(coll)
        out: list[object] = []
        for b in sends:
            c = rec._parse(b, "c", 64 << 20)
            if isinstance(c, tuple):
                out.append(c[:2])
                continue
            rec.rates.commit(c.rate_updates)
            out.append((c.columnar, c.summary(), [(p.batch.agent.node, p.n, p.columns, p.ts.tolist(),
                                                   np.nan_to_num(p.vals, nan=-7.0).tolist()) for p in c.prepared]))
        return out

    with_c = run()
    monkeypatch.setattr(wire, "_NATIVE", None)
    without = run()
    assert with_c == without
    assert [x[0] for x in with_c[:3]] == [False, True, True]  # (first send: the series are new)
    assert with_c[-1][0] == 400
