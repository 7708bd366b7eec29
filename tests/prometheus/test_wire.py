"""The hand-written remote-write codec against the protobuf library's own encoding of the same
prometheus.WriteRequest messages, and against broken bodies."""

from __future__ import annotations

import math
import random

import pytest

from gpufleet.collector.remote_write import wire
from gpufleet.protocol import ProtocolError
from tests.prometheus.prompb import WriteRequest


def _random_request(rng: random.Random) -> WriteRequest:
    w = WriteRequest()
    for _ in range(rng.randint(0, 20)):
        ts = w.timeseries.add()
        names = sorted(rng.sample(["__name__", "UUID", "gpu", "Hostname", "pod", "a" * 200, "é"], rng.randint(0, 6)))
        for n in names:
            ts.labels.add(name=n, value=rng.choice(["", "x", "GPU-1234", "ü" * 100, "v" * 300]))
        for _ in range(rng.randint(0, 4)):
            ts.samples.add(value=rng.choice([0.0, -1.5, 1e300, math.inf, rng.random()]),
                           timestamp=rng.choice([0, -1, 1, 1_790_000_000_123, 2**62]))
    for _ in range(rng.randint(0, 3)):
        w.metadata.add(type=rng.randint(0, 7), metric_family_name=rng.choice(["DCGM_FI_DEV_GPU_UTIL", "m"]),
                       help="h")
    return w


def test_decoder_reads_what_the_protobuf_library_writes() -> None:
    rng = random.Random(7)
    for _ in range(300):
        ref = _random_request(rng)
        got = wire.decode(ref.SerializeToString())
        assert len(got.series) == len(ref.timeseries)
        for s, r in zip(got.series, ref.timeseries, strict=True):
            assert wire.labels_of(s.key) == {lab.name: lab.value for lab in r.labels}
            assert s.samples == [(x.timestamp, x.value) for x in r.samples]
        assert got.metadata == {m.metric_family_name: m.type for m in ref.metadata}


def test_encoder_writes_what_the_protobuf_library_reads() -> None:
    labels = [("__name__", "DCGM_FI_DEV_POWER_USAGE"), ("UUID", "GPU-1"), ("Hostname", "n1")]
    raw = wire.encode([(wire.encode_labels(labels), [(1_790_000_000_000, 71.5), (-5, 0.0)])],
                      [("DCGM_FI_DEV_POWER_USAGE", 2)])
    ref = WriteRequest.FromString(raw)
    (ts,) = ref.timeseries
    assert [(lab.name, lab.value) for lab in ts.labels] == sorted(labels)  # sorted by name, as the spec wants
    assert [(x.timestamp, x.value) for x in ts.samples] == [(1_790_000_000_000, 71.5), (-5, 0.0)]
    assert ref.metadata[0].metric_family_name == "DCGM_FI_DEV_POWER_USAGE" and ref.metadata[0].type == 2


def test_every_truncation_is_refused_exactly_when_the_protobuf_library_refuses_it() -> None:
    from google.protobuf.message import DecodeError

    raw = _random_request(random.Random(3)).SerializeToString()
    assert len(raw) > 100
    refused = 0
    for cut in range(1, len(raw)):
        try:
            ref = WriteRequest.FromString(raw[:cut])
        except DecodeError:
            with pytest.raises(ProtocolError):
                wire.decode(raw[:cut])
            refused += 1
            continue
        # A cut between two top-level messages is a valid, shorter request: same content.
        got = wire.decode(raw[:cut])
        assert [s.samples for s in got.series] == [[(x.timestamp, x.value) for x in r.samples]
                                                    for r in ref.timeseries]
    assert refused > len(raw) // 2


def test_garbage_is_refused_with_where() -> None:
    with pytest.raises(ProtocolError, match="wire type"):
        wire.decode(b"\x0f\x00")
    with pytest.raises(ProtocolError):
        wire.decode(b"\x0a\x05\x0a")


def test_snappy_round_trip_and_a_bomb_is_refused_before_inflating() -> None:
    raw = b"x" * 100_000
    assert wire.unsnappy(wire.snappy(raw), max_size=200_000) == raw
    with pytest.raises(ProtocolError, match="exceeds"):
        wire.unsnappy(wire.snappy(raw), max_size=99_999)
    claims_4gib = bytes([0x80, 0x80, 0x80, 0x80, 0x10]) + b"\x00" * 10
    with pytest.raises(ProtocolError, match="exceeds"):
        wire.unsnappy(claims_4gib, max_size=8 << 20)
    with pytest.raises(ProtocolError, match="corrupt"):
        wire.unsnappy(bytes([20]) + b"\xff" * 10, max_size=100)
    with pytest.raises(ProtocolError, match="no length"):
        wire.unsnappy(b"", max_size=100)


def test_the_known_series_fast_path_reads_exactly_what_the_full_walk_reads() -> None:
    rng = random.Random(11)
    for _ in range(200):
        w = WriteRequest()
        for _ in range(rng.randint(1, 30)):
            ts = w.timeseries.add()
            for n in sorted(rng.sample(["__name__", "UUID", "gpu", "Hostname", "x" * 150], rng.randint(0, 5))):
                ts.labels.add(name=n, value=rng.choice(["", "a", "GPU-1", "\x12\x10\x09" * 7, "v" * 140]))
            for _ in range(rng.choice([0, 1, 1, 1, 2])):
                ts.samples.add(value=rng.choice([0.0, 1.5, -2.0, math.nan]),
                               timestamp=rng.choice([1_790_000_000_123, 0, -5, 1 << 40, (1 << 35) - 1]))
        raw = w.SerializeToString()
        slow = wire.decode(raw)
        known = {s.key for s in slow.series}
        assert repr(wire.decode(raw, known)) == repr(slow)  # repr: NaN samples compare equal


def test_the_vectorised_series_bounds_are_the_walks_or_none_and_the_scan_reads_what_decode_reads() -> None:
    # Bodies of one-sample series, the columnar scan's case, with labels of 128+ bytes (a label
    # header then looks like a series header) and label bytes that look like a sample's tail:
    # the bounds found over the whole body must be the walk's exactly, or None (the walk then).
    import numpy as np

    rng = random.Random(12)
    fast = fallback = 0
    for _ in range(300):
        w = WriteRequest()
        for _ in range(rng.randint(1, 40)):
            ts = w.timeseries.add()
            names = rng.sample(["__name__", "UUID", "gpu", "Hostname", "x" * 150], rng.randint(1, 5))
            for n in sorted(names + (["instance"] if rng.random() < 0.98 else [])):  # most series 128+ bytes
                ts.labels.add(name=n, value="h" * 120 if n == "instance" else
                              rng.choice(["a", "GPU-1", "\x12\x10\x09" * 7, "v" * 140, "é" * 70]))
            for _ in range(rng.choice([1] * 40 + [0, 2])):
                # (not 0.0: protobuf omits it, and a sample without its value is the walk's case;
                # the known-labels check then tells a label's bytes from a sample's, see below)
                ts.samples.add(value=rng.choice([1.5, -2.0]),
                               timestamp=rng.choice([1_790_000_000_123, 1 << 40, (1 << 35) + 1]))
        raw = w.SerializeToString()
        got = wire._series_bounds(np.frombuffer(raw, dtype=np.uint8))
        walk = wire._series_bounds_walk(raw)
        if got is None:
            fallback += walk is not None
        else:
            fast += 1
            assert got == walk
        cols = wire.scan_single_samples(raw, None)
        ref = wire.decode(raw)
        # (a series of two samples scans as one whose key holds the first: never a known label
        # encoding, so convert_columnar declines it; that check is the caller's, known=None here)
        if cols is not None and all(len(s.samples) == 1 for s in ref.series):
            assert cols.keys == [s.key for s in ref.series]
            assert list(zip(cols.ts_ms.tolist(), cols.values.tolist(), strict=True)) == \
                [s.samples[0] for s in ref.series]
        elif all(len(s.samples) == 1 and s.samples[0][0] >= 1 << 35 for s in ref.series):
            # the walk's own refusals only: a series of under 128 bytes is not the vector path's
            assert got is None
    assert fast > 25 and fallback > 10, (fast, fallback)  # both ways taken
