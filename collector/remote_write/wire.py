"""Prometheus remote write 1.0 on the wire: snappy block framing and the ``prometheus.WriteRequest``
protobuf (prompb/remote.proto, prompb/types.proto), decoded and encoded by hand.

Why by hand: only four messages matter (WriteRequest, TimeSeries, Label, Sample, plus the
MetricMetadata Prometheus sends beside them), and the receiver wants the raw bytes of each
series' labels: identical label bytes are the same series, so a series is mapped once and then
recognised by a dict lookup, instead of building a Python object per label on every request.

    WriteRequest   { repeated TimeSeries timeseries = 1; repeated MetricMetadata metadata = 3; }
    TimeSeries     { repeated Label labels = 1; repeated Sample samples = 2;
                     repeated Exemplar exemplars = 3; repeated Histogram histograms = 4; }
    Label          { string name = 1; string value = 2; }
    Sample         { double value = 1; int64 timestamp = 2; }          // milliseconds
    MetricMetadata { MetricType type = 1; string metric_family_name = 2; string help = 4; string unit = 5; }
"""

from __future__ import annotations

import struct
from collections.abc import Container, Iterable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import cramjam
import numpy as np

from gpufleet.protocol import ProtocolError

COUNTER = 1  # MetricMetadata.MetricType.COUNTER
_DOUBLE = struct.Struct("<d")
_U64 = 1 << 64


@dataclass(slots=True)
class Series:
    """One TimeSeries: ``key`` is its encoded labels (the same series always has the same
    bytes, since senders sort labels by name), ``samples`` its (timestamp ms, value) pairs."""

    key: bytes
    samples: list[tuple[int, float]]
    histograms: int = 0  # native histograms: counted, not decoded (no catalog field is one)


@dataclass(slots=True)
class WriteRequest:
    series: list[Series] = field(default_factory=list)
    metadata: dict[str, int] = field(default_factory=dict)  # metric family -> MetricType


def snappy_uncompressed_length(body: bytes) -> int:
    """The length a snappy block says it inflates to (its leading varint), read before
    inflating so a small body that claims gigabytes is refused without allocating them."""
    try:
        n, _ = _varint(body, 0)
    except ProtocolError:
        raise ProtocolError("snappy body is empty or corrupt (no length header)") from None
    return n


def unsnappy(body: bytes, *, max_size: int) -> bytes:
    n = snappy_uncompressed_length(body)
    if n > max_size:
        raise ProtocolError(f"decompressed body of {n} bytes exceeds the limit of {max_size}")
    try:
        return bytes(cramjam.snappy.decompress_raw(body))
    except cramjam.DecompressionError as e:
        raise ProtocolError(f"snappy body is corrupt: {e}") from None


def snappy(raw: bytes) -> bytes:
    return bytes(cramjam.snappy.compress_raw(raw))


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    n = len(buf)
    while pos < n:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ProtocolError(f"varint longer than 10 bytes at offset {pos}")
    raise ProtocolError(f"truncated varint at offset {pos}")


def _skip(buf: bytes, pos: int, wire: int) -> int:
    if wire == 0:
        return _varint(buf, pos)[1]
    if wire == 1:
        return pos + 8
    if wire == 2:
        n, pos = _varint(buf, pos)
        return pos + n
    if wire == 5:
        return pos + 4
    raise ProtocolError(f"unsupported protobuf wire type {wire} at offset {pos}")


def decode(raw: bytes, known: Container[bytes] = (), *, native: bool = True) -> WriteRequest:
    """A decompressed WriteRequest body; ProtocolError (400: never retried, the bytes will not
    change) names the offset of what is malformed. Read by the C pass (``scan``) where it is
    built and ``native``, else (and where the C pass leaves a body to Python) by the Python
    decoder below: the same series, samples, metadata and errors either way. ``known``: label
    encodings seen before (the receiver's series cache); the Python decoder reads a series made
    of one of them and a single sample from its last 18 bytes without walking its labels (what
    nearly every series of a Prometheus request is: one sample per series per send)."""
    if native and (scanned := scan(raw)) is not None:
        return scanned.request()
    try:
        return _decode(raw, known)
    except ProtocolError as e:
        raise ProtocolError(f"malformed WriteRequest protobuf: {e}") from None
    except IndexError:
        raise ProtocolError("malformed WriteRequest protobuf: truncated") from None
    except struct.error:
        raise ProtocolError("malformed WriteRequest protobuf: truncated inside a sample value") from None


# --- the optional C pass (_decode_c.c) -------------------------------------------------------

def _load_native() -> ModuleType | None:
    """The C pass (_decode_c.c, built by setup.py where a C compiler is): the body's series,
    samples and metadata as columns in one walk of its bytes, where the Python decoder costs a
    few Python operations per field; None where it was not built (Python then decodes)."""
    try:
        from . import _decode_c
    except ImportError:
        return None
    return _decode_c


_NATIVE = _load_native()


@dataclass(slots=True)
class Scanned:
    """A whole body as the C pass reads it: series ``i`` is ``keys[i]`` (its label bytes, as
    ``Series.key``) with samples ``first[i]:first[i + 1]`` of ``ts_ms`` / ``values`` and
    ``histograms[i]`` native histograms."""

    keys: list[bytes]
    first: np.ndarray  # int64, len(keys) + 1
    ts_ms: np.ndarray  # int64
    values: np.ndarray  # float64
    histograms: np.ndarray  # int64, len(keys)
    metadata: dict[str, int]
    single: bool  # every series has one sample and no histogram

    def single_samples(self) -> SingleSamples | None:
        """The columnar path's columns, when this is its case (series of one sample each, no
        metadata: ``scan_single_samples``'s answer, whatever the samples' byte layout)."""
        if not self.single or self.metadata or not self.keys:
            return None
        return SingleSamples(self.keys, self.ts_ms, self.values)

    def request(self) -> WriteRequest:
        """The same body as ``decode``'s objects (the general conversion's input)."""
        pairs = list(zip(self.ts_ms.tolist(), self.values.tolist(), strict=True))
        first = self.first.tolist()
        hist = self.histograms.tolist()
        return WriteRequest([Series(k, pairs[first[i]:first[i + 1]], hist[i]) for i, k in enumerate(self.keys)],
                            dict(self.metadata))


def scan(raw: bytes) -> Scanned | None:
    """``raw`` read by the C pass; ProtocolError where it is malformed (the Python decoder's
    message, for the same first fault); None where the C pass is not built or leaves the body
    to the Python decoder (a label after a series' samples, a length of 2**48 or more, a varint
    of 2**64 or more where a number is kept: valid protobuf that no sender writes)."""
    got = native_scan("scan", raw, "WriteRequest")
    return None if got is None else scanned_of(got)


def native_scan(name: str, raw: bytes, message: str) -> tuple[Any, ...] | None:
    """The C pass ``name`` (``scan``, ``scan_v2``) over ``raw``: its tuple, None where it is not
    built or hands the body to Python, ProtocolError naming ``message`` where it is malformed."""
    if _NATIVE is None:
        return None
    try:
        got: tuple[Any, ...] | None = getattr(_NATIVE, name)(raw)
    except ValueError as e:
        raise ProtocolError(f"malformed {message} protobuf: {e}") from None
    return got


def scanned_of(got: tuple[Any, ...]) -> Scanned:
    """The C pass's tuple (``scan``'s, or ``scan_v2``'s first seven) as ``Scanned``."""
    keys, first, ts, values, hist, meta, single = got[:7]
    # one (family, type) per metadata entry, in body order (2.0: one per typed series): dict()
    # keeps the last of each family (as _metadata does) at C speed and only the distinct ones
    # are decoded; names that are not UTF-8 may collide once replaced: then entry by entry
    try:
        metadata = {name.decode("utf-8"): kind for name, kind in dict(meta).items()}
    except UnicodeDecodeError:
        metadata = {}
        for name, kind in meta:
            metadata[name.decode("utf-8", "replace")] = kind
    return Scanned(keys, np.frombuffer(first, dtype=np.int64), np.frombuffer(ts, dtype=np.int64),
                   np.frombuffer(values, dtype=np.float64), np.frombuffer(hist, dtype=np.int64), metadata, single)


def _decode(raw: bytes, known: Container[bytes]) -> WriteRequest:
    out = WriteRequest()
    series = out.series
    pos = 0
    end = len(raw)
    unpack = _DOUBLE.unpack_from
    while pos < end:
        tag = raw[pos]
        if tag == 0x0A:  # timeseries (field 1, length-delimited): the common case, inlined
            b = raw[pos + 1]
            if b < 0x80:
                n, pos = b, pos + 2
            elif raw[pos + 2] < 0x80:  # 128..16383 bytes: a series with a dozen labels
                n, pos = (b & 0x7F) | raw[pos + 2] << 7, pos + 3
            else:
                n, pos = _varint(raw, pos + 1)
            stop = pos + n
            if stop > end:
                raise ProtocolError(f"timeseries at offset {pos} runs past the end of the body")
            t = stop - 18  # fast path: known labels + one sample {0x09 double, 0x10 6-byte varint ts}
            if (n > 18 and raw[t] == 0x12 and raw[t + 1] == 0x10 and raw[t + 2] == 0x09 and raw[t + 11] == 0x10
                    and raw[stop - 1] < 0x80 and (key := raw[pos:t]) in known):
                ts = ((raw[t + 12] & 0x7F) | (raw[t + 13] & 0x7F) << 7 | (raw[t + 14] & 0x7F) << 14
                      | (raw[t + 15] & 0x7F) << 21 | (raw[t + 16] & 0x7F) << 28 | raw[t + 17] << 35)
                if raw[t + 12] & raw[t + 13] & raw[t + 14] & raw[t + 15] & raw[t + 16] & 0x80:
                    series.append(Series(key, [(ts, unpack(raw, t + 3)[0])]))
                    pos = stop
                    continue
            series.append(_series(raw, pos, stop))
            pos = stop
            continue
        tag, pos = _varint(raw, pos)
        if tag == 0x1A:  # metadata (field 3)
            n, pos = _varint(raw, pos)
            _metadata(raw, pos, pos + n, out.metadata)
            pos += n
        else:
            pos = _skip(raw, pos, tag & 7)
    if pos != end:
        raise ProtocolError("protobuf body ends inside a field")
    return out


def looks_like_v2(raw: bytes) -> bool:
    """Whether a body that decoded as 1.0 to no series holds 2.0's top-level fields instead
    (4: symbols, 5: timeseries, both length-delimited), which 1.0 does not define."""
    pos, end = 0, len(raw)
    try:
        while pos < end:
            tag, pos = _varint(raw, pos)
            if tag in (0x22, 0x2A):
                return True
            pos = _skip(raw, pos, tag & 7)
    except (ProtocolError, IndexError):
        return False
    return False


def _series(raw: bytes, pos: int, stop: int) -> Series:
    start = pos
    # Labels first (senders write them first): walk them only to find where they end.
    while pos < stop and raw[pos] == 0x0A:
        b = raw[pos + 1]
        if b < 0x80:
            pos += 2 + b
        else:
            n, pos = _varint(raw, pos + 1)
            pos += n
    key = raw[start:pos]
    samples: list[tuple[int, float]] = []
    hist = 0
    extra_labels: list[bytes] = []
    while pos < stop:
        tag = raw[pos]
        if tag == 0x12:  # sample
            b = raw[pos + 1]
            if b < 0x80:
                n, pos = b, pos + 2
            else:
                n, pos = _varint(raw, pos + 1)
            samples.append(_sample(raw, pos, pos + n))
            pos += n
            continue
        tag, p2 = _varint(raw, pos)
        if tag == 0x0A:  # a label after samples: legal protobuf, unusual; keep it in the key
            n, p3 = _varint(raw, p2)
            extra_labels.append(raw[pos:p3 + n])
            pos = p3 + n
        elif tag == 0x22:  # native histogram
            hist += 1
            pos = _skip(raw, p2, 2)
        else:
            pos = _skip(raw, p2, tag & 7)
    if pos != stop:
        raise ProtocolError(f"timeseries ending at offset {stop} is malformed")
    if extra_labels:
        key = key + b"".join(extra_labels)
    return Series(key, samples, hist)


def _sample(raw: bytes, pos: int, stop: int) -> tuple[int, float]:
    # proto3 omits zero values: a missing field is 0 (value 0.0, timestamp 0).
    value = 0.0
    ts = 0
    while pos < stop:
        tag = raw[pos]
        if tag == 0x09:
            value = _DOUBLE.unpack_from(raw, pos + 1)[0]
            pos += 9
        elif tag == 0x10:
            ts, pos = _varint(raw, pos + 1)
            if ts >= 1 << 63:
                ts -= _U64
        else:
            t, pos = _varint(raw, pos)
            pos = _skip(raw, pos, t & 7)
    if pos != stop:
        raise ProtocolError(f"sample ending at offset {stop} is malformed")
    return ts, value


def _metadata(raw: bytes, pos: int, stop: int, into: dict[str, int]) -> None:
    kind = 0
    name = ""
    while pos < stop:
        tag, pos = _varint(raw, pos)
        if tag == 0x08:
            kind, pos = _varint(raw, pos)
        elif tag == 0x12:
            n, pos = _varint(raw, pos)
            name = raw[pos:pos + n].decode("utf-8", "replace")
            pos += n
        else:
            pos = _skip(raw, pos, tag & 7)
    if name:
        into[name] = kind


def labels_of(key: bytes) -> dict[str, str]:
    """A series' labels from its ``key``; ProtocolError when they are not valid UTF-8 or malformed."""
    out: dict[str, str] = {}
    pos = 0
    end = len(key)
    try:
        while pos < end:
            tag, pos = _varint(key, pos)
            n, pos = _varint(key, pos)
            if tag != 0x0A:
                raise ProtocolError(f"unexpected field in a series' labels (tag {tag})")
            stop = pos + n
            name = value = ""
            while pos < stop:
                t, pos = _varint(key, pos)
                m, pos = _varint(key, pos)
                s = key[pos:pos + m].decode("utf-8")
                pos += m
                if t == 0x0A:
                    name = s
                elif t == 0x12:
                    value = s
            out[name] = value
    except UnicodeDecodeError:
        raise ProtocolError("a label is not valid UTF-8") from None
    return out


# --- encoding (the exporter, tests and the benchmark) ---------------------------------------

def _put_varint(out: bytearray, v: int) -> None:
    if v < 0:
        v += _U64
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


put_varint = _put_varint


def _put_bytes(out: bytearray, tag: int, data: bytes) -> None:
    out.append(tag)
    _put_varint(out, len(data))
    out += data


def encode_labels(labels: Iterable[tuple[str, str]]) -> bytes:
    """Labels as a TimeSeries' label fields, sorted by name as the spec requires."""
    out = bytearray()
    for name, value in sorted(labels):
        lab = bytearray()
        _put_bytes(lab, 0x0A, name.encode())
        _put_bytes(lab, 0x12, value.encode())
        _put_bytes(out, 0x0A, bytes(lab))
    return bytes(out)


def encode_sample(ts_ms: int, value: float) -> bytes:
    s = bytearray(b"\x09")
    s += _DOUBLE.pack(value)
    s.append(0x10)
    _put_varint(s, ts_ms)
    out = bytearray()
    _put_bytes(out, 0x12, bytes(s))
    return bytes(out)


def encode(series: Sequence[tuple[bytes, Sequence[tuple[int, float]]]],
           metadata: Sequence[tuple[str, int]] = ()) -> bytes:
    """A WriteRequest from (encoded labels, [(timestamp ms, value)]) pairs, uncompressed."""
    out = bytearray()
    for labels, samples in series:
        ts = bytearray(labels)
        for t, v in samples:
            ts += encode_sample(t, v)
        _put_bytes(out, 0x0A, bytes(ts))
    for name, kind in metadata:
        m = bytearray(b"\x08")
        _put_varint(m, kind)
        _put_bytes(m, 0x12, name.encode())
        _put_bytes(out, 0x1A, bytes(m))
    return bytes(out)


# --- the columnar fast path (mapping_columnar) -----------------------------------------------

@dataclass(slots=True)
class SingleSamples:
    """A body whose every series is labels seen before plus one sample (a Prometheus shard's
    steady state), as columns: ``keys[i]`` the label bytes, ``ts_ms[i]`` / ``values[i]`` its
    sample."""

    keys: list[bytes]
    ts_ms: np.ndarray  # int64
    values: np.ndarray  # float64


def scan_single_samples(raw: bytes, known: Container[bytes] | None, *, native: bool = True) -> SingleSamples | None:
    """``raw`` as columns when every top-level field is a series of known labels and one sample
    in the canonical layout (``_decode``'s fast path), else None: the caller then decodes it
    the general way, which also names what is malformed. ``known`` None: the caller checks
    that every key is a known label encoding (``columnar.Slots.ids``). With the C pass
    (``native`` and built): ``scan``'s columns, any sample layout. Without it: only the series
    boundaries are found in Python; the layout checks, timestamps and values are read for all
    series at once."""
    if native and _NATIVE is not None:
        try:
            scanned = scan(raw)
        except ProtocolError:
            return None  # (decode says what is malformed)
        if scanned is not None:
            cols = scanned.single_samples()
            if cols is not None and known is not None and not all(map(known.__contains__, cols.keys)):
                return None
            return cols
    buf = np.frombuffer(raw, dtype=np.uint8)
    found = _series_bounds(buf)
    if found is not None:
        starts, stops = found
    else:
        bounds = _series_bounds_walk(raw)
        if bounds is None:
            return None
        starts, stops = bounds
    t = np.array(stops, dtype=np.int64) - 18
    cont = buf[t + 12] & buf[t + 13] & buf[t + 14] & buf[t + 15] & buf[t + 16]
    if not ((buf[t] == 0x12) & (buf[t + 1] == 0x10) & (buf[t + 2] == 0x09) & (buf[t + 11] == 0x10)
            & (buf[t + 17] < 0x80) & (cont >= 0x80)).all():
        return None
    ts = np.zeros(len(t), dtype=np.int64)
    for k in range(5):
        ts |= (buf[t + 12 + k].astype(np.int64) & 0x7F) << (7 * k)
    ts |= buf[t + 17].astype(np.int64) << 35
    values = buf[(t + 3)[:, None] + np.arange(8)].copy().view("<f8").ravel()
    tails = t.tolist()
    keys = [raw[s:e] for s, e in zip(starts, tails, strict=True)]
    if known is not None and not all(map(known.__contains__, keys)):
        return None
    return SingleSamples(keys, ts, values)


def _series_bounds(buf: np.ndarray) -> tuple[list[int], list[int]] | None:
    """Where each top-level series' content starts and stops, found over the whole body at once
    (what ``_series_bounds_walk`` finds one series after the other), or None when not sure.

    A candidate is a series header as a steady-state body has it: tag 0x0A, a 2-byte length
    (128..16383 bytes: a GPU series has a dozen labels), content that begins with a label (0x0A)
    and ends in a sample's canonical bytes (0x12 0x10, 18 bytes before its end). A label is
    0x0A and a 1-byte length, so labels are not candidates. The candidates are exactly the body's
    series only if they chain: the first at 0, each one's end the next one's start, the last one's
    end the body's end. Anything else (a short series, metadata, a label's bytes that pass the
    filter) breaks the chain, and the caller walks the body instead: correct either way."""
    end = len(buf)
    if end < 24:
        return None
    tag = buf == 0x0A
    c = np.flatnonzero(tag[:-3] & tag[3:])  # (one pass over the body for the two rarest tests)
    b1 = buf[c + 1].astype(np.int64)
    b2 = buf[c + 2].astype(np.int64)
    two = (b1 >= 0x80) & (b2 < 0x80)
    c, b1, b2 = c[two], b1[two], b2[two]
    if not len(c) or c[0] != 0:
        return None
    start = c + 3
    stop = start + ((b1 & 0x7F) | (b2 << 7))
    t = np.minimum(stop, end) - 18
    ok = (stop <= end) & (t > start)  # more than the 18 sample bytes, as the walk requires
    t = np.where(ok, t, 0)
    ok &= (buf[t] == 0x12) & (buf[t + 1] == 0x10)
    if not ok.all():
        c, start, stop = c[ok], start[ok], stop[ok]
        if not len(c) or c[0] != 0:
            return None
    if stop[-1] != end or not np.array_equal(stop[:-1], c[1:]):
        return None
    return start.tolist(), stop.tolist()


def _series_bounds_walk(raw: bytes) -> tuple[list[int], list[int]] | None:
    """``_series_bounds`` one series after the other; None when a top-level field is not a
    series of the canonical single-sample size (the general decoder's case)."""
    starts: list[int] = []
    stops: list[int] = []
    pos = 0
    end = len(raw)
    try:
        while pos < end:
            if raw[pos] != 0x0A:
                return None  # metadata or an unknown field: the general decoder
            b = raw[pos + 1]
            if b < 0x80:
                n, pos = b, pos + 2
            elif raw[pos + 2] < 0x80:
                n, pos = (b & 0x7F) | raw[pos + 2] << 7, pos + 3
            else:
                return None
            if n <= 18:
                return None
            starts.append(pos)
            pos += n
            stops.append(pos)
    except IndexError:
        return None
    if pos != end or not starts:
        return None
    return starts, stops
