"""The hand-written remote write 2.0 decoder against the protobuf library's own encoding of
io.prometheus.write.v2.Request (built from the spec's schema, tests/prometheus/prompb.py), and
against broken bodies: a 2.0 series decodes to the very key and samples 1.0 gives the same series."""

from __future__ import annotations

import math
import random
import struct

import pytest

from gpufleet.collector.remote_write import wire, wire_v2
from gpufleet.protocol import ProtocolError
from tests.prometheus.prompb import COUNTER_V2, GAUGE_V2, V2, request_v2
from tests.prometheus.test_decode_c import _native

NAMES = ["__name__", "UUID", "gpu", "Hostname", "pod", "namespace", "a" * 200, "é"]
VALUES = ["DCGM_FI_DEV_GPU_UTIL", "x", "GPU-1234", "ü" * 100, "v" * 300, "0"]


def _random_series(rng: random.Random) -> list[tuple[dict[str, str], list[tuple[int, float]]]]:
    out = []
    for _ in range(rng.randint(0, 20)):
        labels = {n: rng.choice(VALUES) for n in rng.sample(NAMES, rng.randint(1, 6))}
        samples = [(rng.choice([1, -1, 1_790_000_000_123, 2**62]),
                    rng.choice([0.0, -1.5, 1e300, math.inf, rng.random()])) for _ in range(rng.randint(0, 4))]
        out.append((labels, samples))
    return out


@pytest.mark.parametrize("native", [True, False])
def test_a_v2_series_decodes_to_the_key_and_samples_v1_gives_the_same_series(native: bool) -> None:
    rng = random.Random(11)
    for _ in range(300):
        series = _random_series(rng)
        got = wire_v2.decode(request_v2(series), native=native).request
        v1 = wire.decode(wire.encode([(wire.encode_labels(lab.items()), s) for lab, s in series]))
        assert [(s.key, s.samples) for s in got.series] == [(s.key, s.samples) for s in v1.series]
        for s, (labels, _) in zip(got.series, series, strict=True):
            assert wire.labels_of(s.key) == labels


@pytest.mark.parametrize("native", [True, False])
def test_unpacked_references_and_symbols_after_the_series_give_the_same_series(native: bool) -> None:
    labels = {"__name__": "DCGM_FI_DEV_POWER_USAGE", "UUID": "GPU-1", "Hostname": "n1"}
    req = V2["Request"](symbols=["", "__name__", "DCGM_FI_DEV_POWER_USAGE", "UUID", "GPU-1", "Hostname", "n1"])
    req.timeseries.add(labels_refs=[1, 2, 5, 6, 3, 4]).samples.add(value=71.5, timestamp=1_790_000_000_000)
    (s,) = wire_v2.decode(req.SerializeToString(), native=native).request.series
    # the key is the labels in the order sent (a conforming sender sorts them: 1.0's key then)
    assert wire.labels_of(s.key) == labels and s.samples == [(1_790_000_000_000, 71.5)]
    assert s.key == wire.encode_labels([("__name__", "DCGM_FI_DEV_POWER_USAGE")]) + \
        wire.encode_labels([("Hostname", "n1")]) + wire.encode_labels([("UUID", "GPU-1")])
    # the same series with its references unpacked (tag 0x08 each) and the symbols written last
    series_bytes = bytearray()
    for r in [1, 2, 5, 6, 3, 4]:
        series_bytes += bytes([0x08, r])
    sample = V2["Sample"](value=71.5, timestamp=1_790_000_000_000).SerializeToString()
    series_bytes += bytes([0x12, len(sample)]) + sample
    body = bytes([0x2A, len(series_bytes)]) + bytes(series_bytes)
    for sym in req.symbols:
        body += bytes([0x22, len(sym.encode())]) + sym.encode()
    (again,) = wire_v2.decode(body, native=native).request.series
    assert again.key == s.key and again.samples == s.samples
    assert V2["Request"].FromString(body).timeseries[0].labels_refs == [1, 2, 5, 6, 3, 4]  # valid protobuf


def _bits(series: list[wire.Series]) -> list[tuple[bytes, list[tuple[int, bytes]], int]]:
    return [(s.key, [(t, struct.pack("<d", v)) for t, v in s.samples], s.histograms) for s in series]


def test_the_c_pass_reads_what_the_python_decoder_reads() -> None:
    _native()  # (fails where a compiler is here and the pass is not built; skips where none is)
    rng = random.Random(23)
    for _ in range(300):
        series = _random_series(rng)
        types = {lab.get("__name__", ""): rng.choice([0, 1, 2]) for lab, _ in series}
        req = V2["Request"].FromString(request_v2(series, types))
        for ts in req.timeseries:
            if rng.random() < 0.2:
                ts.histograms.add(count_int=1, timestamp=5)
            if rng.random() < 0.2:
                ts.exemplars.add(value=1.0)
        raw = req.SerializeToString()
        found = wire_v2.scan(raw)
        assert found is not None
        c, py = wire_v2.decode(raw), wire_v2.decode(raw, native=False)
        assert [(s.key, s.samples, s.histograms) for s in c.request.series] == \
            [(s.key, s.samples, s.histograms) for s in py.request.series]
        assert c.request.metadata == py.request.metadata and c.exemplars == py.exemplars
        assert found[0].single == all(len(s.samples) == 1 and not s.histograms for s in py.request.series)


def test_the_c_pass_refuses_every_body_the_python_decoder_refuses() -> None:
    _native()
    rng = random.Random(29)
    raw = request_v2(_random_series(rng) or [({"a": "b"}, [(1, 1.0)])], {"DCGM_FI_DEV_GPU_UTIL": 2})
    bodies = [raw[:cut] for cut in range(len(raw))]
    for _ in range(3000):  # single-byte corruptions
        b = bytearray(raw)
        b[rng.randrange(len(b))] = rng.randrange(256)
        bodies.append(bytes(b))
    refused = 0
    for body in bodies:
        try:
            want = wire_v2.decode(body, native=False)
        except ProtocolError:
            refused += 1
            with pytest.raises(ProtocolError):
                wire_v2.decode(body)
            continue
        got = wire_v2.decode(body)
        assert _bits(got.request.series) == _bits(want.request.series)  # (a corrupted value may be NaN)
        assert got.request.metadata == want.request.metadata
    assert refused > 100


@pytest.mark.parametrize("native", [True, False])
def test_metadata_types_histograms_and_exemplars_are_read(native: bool) -> None:
    series = [({"__name__": "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "UUID": "GPU-1"}, [(1000, 5.0)]),
              ({"__name__": "DCGM_FI_DEV_GPU_TEMP", "UUID": "GPU-1"}, [(1000, 40.0)]),
              ({"__name__": "DCGM_FI_DEV_SM_CLOCK", "UUID": "GPU-1"}, [(1000, 1980.0)])]
    req = V2["Request"].FromString(request_v2(series, {"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": COUNTER_V2,
                                                        "DCGM_FI_DEV_GPU_TEMP": GAUGE_V2}))
    req.timeseries[1].histograms.add(count_int=3, sum=1.5, timestamp=1000)
    req.timeseries[1].exemplars.add(value=2.0, timestamp=1000)
    req.timeseries[1].exemplars.add(value=3.0, timestamp=1000)
    req.timeseries[0].created_timestamp = 500
    req.timeseries[0].samples[0].start_timestamp = 400
    got = wire_v2.decode(req.SerializeToString(), native=native)
    # an unspecified type (the third series) says nothing about its family
    assert got.request.metadata == {"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": wire.COUNTER,
                                    "DCGM_FI_DEV_GPU_TEMP": GAUGE_V2}
    assert [s.histograms for s in got.request.series] == [0, 1, 0]
    assert got.exemplars == 2
    assert got.request.series[0].samples == [(1000, 5.0)]


@pytest.mark.parametrize(("raw", "needle"), [
    (V2["Request"](symbols=["", "a"], timeseries=[V2["TimeSeries"](labels_refs=[1, 2])]).SerializeToString(),
     "past the symbols table"),
    (V2["Request"](symbols=["", "a"], timeseries=[V2["TimeSeries"](labels_refs=[1])]).SerializeToString(),
     "even count"),
    (wire.encode([(wire.encode_labels([("UUID", "GPU-1")]), [(1, 2.0)])]), "1.0 body"),
    (bytes([0x2A, 0x05, 0x0A, 0x09]), "past the end"),
    (bytes([0x22, 0x7F, 0x61]), "past the end"),
    (bytes([0x2A, 0x04, 0x12, 0x02, 0x09, 0x00]), "truncated"),
])
@pytest.mark.parametrize("native", [True, False])
def test_malformed_bodies_are_protocol_errors_that_name_the_fault(raw: bytes, needle: str, native: bool) -> None:
    with pytest.raises(ProtocolError, match=needle):
        wire_v2.decode(raw, native=native)


def test_every_truncation_of_a_valid_body_is_refused_or_decodes_what_the_library_decodes() -> None:
    from google.protobuf.message import DecodeError

    raw = request_v2(_random_series(random.Random(5)) or [({"a": "b"}, [(1, 1.0)])])
    assert len(raw) > 100
    for cut in range(len(raw)):
        part = raw[:cut]
        try:
            lib = V2["Request"].FromString(part)
        except DecodeError:
            with pytest.raises(ProtocolError):
                wire_v2.decode(part)
            continue
        # a cut on a field boundary is a valid shorter request (its refs may point nowhere yet)
        try:
            got = wire_v2.decode(part).request
        except ProtocolError as e:
            assert "symbols table" in str(e) or "even count" in str(e)
            continue
        assert len(got.series) == len(lib.timeseries)
