"""Prometheus remote write 2.0 on the wire: the ``io.prometheus.write.v2.Request`` protobuf
(prompb/io/prometheus/write/v2/types.proto), decoded by hand into the same ``wire.WriteRequest``
the 1.0 decoder gives, so everything after decoding (the series map, counter rates, regrouping
into rows, idempotency) is the one 1.0 path.

    Request    { reserved 1 to 3; repeated string symbols = 4; repeated TimeSeries timeseries = 5; }
    TimeSeries { repeated uint32 labels_refs = 1; repeated Sample samples = 2;
                 repeated Histogram histograms = 3; repeated Exemplar exemplars = 4;
                 Metadata metadata = 5; int64 created_timestamp = 6; }
    Sample     { double value = 1; int64 timestamp = 2; int64 start_timestamp = 3; }
    Metadata   { MetricType type = 1; uint32 help_ref = 3; uint32 unit_ref = 4; }

Each series' labels become the 1.0 encoding of the same labels sorted by name (``wire.encode_labels``'
bytes), so a series has one key whichever version carried it: the series cache, the counter
state and a GPU's rows are shared by a sender that moves from 1.0 to 2.0. Exemplars are
counted, not kept (no catalog field has them); native histograms are counted as 1.0's are.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

from gpufleet.protocol import ProtocolError

from . import wire
from .wire import Scanned, Series, WriteRequest, _skip, _varint

PROTO = "io.prometheus.write.v2.Request"
_DOUBLE = struct.Struct("<d")
_U64 = 1 << 64
_UNSPECIFIED = 0  # Metadata.MetricType.METRIC_TYPE_UNSPECIFIED


@dataclass(slots=True)
class DecodedV2:
    request: WriteRequest
    exemplars: int  # received, not stored (the Exemplars-Written header says 0 of them)


def scan(raw: bytes) -> tuple[Scanned, int] | None:
    """``raw`` read by the C pass (``_decode_c.scan_v2``) as 1.0's columns (``wire.Scanned``:
    its ``single_samples`` feeds the columnar conversion), with the exemplars counted; None
    where the C pass is not built or leaves the body to the Python decoder (unpacked label
    references, a varint of 2**64 or more); ProtocolError where it is malformed."""
    got = wire.native_scan("scan_v2", raw, PROTO)
    return None if got is None else (wire.scanned_of(got), got[7])


def decode(raw: bytes, *, native: bool = True) -> DecodedV2:
    """A decompressed ``io.prometheus.write.v2.Request``; ProtocolError (a 400: the same bytes
    can never be stored) names what is malformed: a truncated field, a symbol reference past
    the symbols table, an odd number of label references. Read by the C pass where it is built
    and ``native``, else (and where the C pass leaves the body to Python) by the Python decoder
    below: the same series, samples and metadata either way."""
    if native and (scanned := scan(raw)) is not None:
        return DecodedV2(scanned[0].request(), scanned[1])
    try:
        return _decode(raw)
    except ProtocolError as e:
        raise ProtocolError(f"malformed io.prometheus.write.v2.Request protobuf: {e}") from None
    except IndexError:
        raise ProtocolError("malformed io.prometheus.write.v2.Request protobuf: truncated") from None
    except struct.error:
        raise ProtocolError("malformed io.prometheus.write.v2.Request protobuf: truncated inside a value") from None


def _decode(raw: bytes) -> DecodedV2:
    # Symbols may follow the series in the bytes (protobuf fixes no field order), so the top
    # level is walked once for both, and the series read after.
    symbols: list[bytes] = []
    spans: list[tuple[int, int]] = []
    pos, end = 0, len(raw)
    while pos < end:
        if raw[pos] == 0x2A and raw[pos + 1] < 0x80:  # a series under 128 bytes: inlined
            n = raw[pos + 1]
            pos += 2
            if pos + n > end:
                raise ProtocolError(f"timeseries at offset {pos} runs past the end of the body")
            spans.append((pos, pos + n))
            pos += n
            continue
        tag, pos = _varint(raw, pos)
        if tag == 0x22:  # symbols (field 4)
            n, pos = _varint(raw, pos)
            if pos + n > end:
                raise ProtocolError(f"symbol at offset {pos} runs past the end of the body")
            symbols.append(raw[pos:pos + n])
            pos += n
        elif tag == 0x2A:  # timeseries (field 5)
            n, pos = _varint(raw, pos)
            if pos + n > end:
                raise ProtocolError(f"timeseries at offset {pos} runs past the end of the body")
            spans.append((pos, pos + n))
            pos += n
        elif tag in (0x0A, 0x12, 0x1A) and not symbols and not spans:
            # fields 1-3 are reserved in 2.0 and are a 1.0 WriteRequest's series and metadata
            raise ProtocolError("this is a remote write 1.0 body (prometheus.WriteRequest) sent as 2.0; "
                                "send it with Content-Type application/x-protobuf")
        else:
            pos = _skip(raw, pos, tag & 7)
    if pos != end:
        raise ProtocolError("protobuf body ends inside a field")
    labels = _Labels(symbols)
    out = WriteRequest()
    exemplars = 0
    for start, stop in spans:
        series, family_type, ex = _series(raw, start, stop, labels)
        out.series.append(series)
        exemplars += ex
        if family_type is not None:
            out.metadata[family_type[0]] = family_type[1]
    return DecodedV2(out, exemplars)


# One (name, value) reference pair of a packed labels_refs field: two varints, as bytes.
_PAIR = re.compile(rb"[\x80-\xff]{0,9}[\x00-\x7f][\x80-\xff]{0,9}[\x00-\x7f]")


class _Labels:
    """Label references -> the 1.0 label bytes (``wire.encode_labels``' layout), in the order
    sent (the spec has senders sort them by name, as 1.0 senders do, so a conforming sender's
    series has the same key in both versions; an unsorted one only misses the series cache: the
    mapping reads the labels, not their order). A request's series share most (name, value)
    pairs, so each pair is resolved once per request, keyed by its two varints' bytes as they
    stand in the packed field, found by one regex pass per series instead of a Python loop per
    varint (28 references in a dcgm-exporter series)."""

    def __init__(self, symbols: list[bytes]) -> None:
        self.symbols = symbols
        self.pairs: dict[bytes, bytes] = {}  # the pair's varint bytes -> its 1.0 label bytes
        self.names: dict[bytes, str] = {}  # the same for __name__ pairs -> the metric name

    def key_packed(self, packed: bytes) -> bytes:
        """The series' key from its packed references (ProtocolError when they are not whole
        pairs of varints or point past the symbols table)."""
        found = _PAIR.findall(packed)
        if sum(map(len, found)) != len(packed):
            return self.key(_unpack_refs(packed))
        pairs = self.pairs
        return b"".join([pairs.get(p) or self._resolve(p) for p in found])

    def key(self, refs: list[int]) -> bytes:
        """The same from references as numbers (unpacked fields, or a packed field that is not
        pairs of canonical varints)."""
        if len(refs) % 2:
            raise ProtocolError(f"a series has {len(refs)} label references (name, value pairs: an even count)")
        return self.key_packed(b"".join(_pair_bytes(refs[i], refs[i + 1]) for i in range(0, len(refs), 2)))

    def name_of(self, packed: bytes) -> str | None:
        """The ``__name__`` among a series' resolved pairs (metadata is keyed by it)."""
        names = self.names
        for p in _PAIR.findall(packed):
            if p in names:
                return names[p]
        return None

    def _resolve(self, pair: bytes) -> bytes:
        a, pos = _varint(pair, 0)
        b, _ = _varint(pair, pos)
        syms = self.symbols
        if a >= len(syms) or b >= len(syms):
            raise ProtocolError(f"label reference {max(a, b)} is past the symbols table ({len(syms)} symbols)")
        if syms[a] == b"__name__":
            self.names[pair] = syms[b].decode("utf-8", "replace")
        got = self.pairs[pair] = _label(syms[a], syms[b])
        return got


def _pair_bytes(a: int, b: int) -> bytes:
    out = bytearray()
    _put_varint(out, a)
    _put_varint(out, b)
    return bytes(out)


def _unpack_refs(packed: bytes) -> list[int]:
    refs: list[int] = []
    pos, end = 0, len(packed)
    while pos < end:
        r, pos = _varint(packed, pos)
        refs.append(r)
    return refs


def _put_varint(out: bytearray, v: int) -> None:
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


def _label(name: bytes, value: bytes) -> bytes:
    inner = bytearray(b"\x0a")
    _put_len(inner, name)
    inner.append(0x12)
    _put_len(inner, value)
    out = bytearray(b"\x0a")
    _put_len(out, bytes(inner))
    return bytes(out)


def _put_len(out: bytearray, data: bytes) -> None:
    v = len(data)
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    out += data


def _series(raw: bytes, pos: int, stop: int, labels: _Labels) -> tuple[Series, tuple[str, int] | None, int]:
    parts: list[bytes | int] = []  # labels_refs as sent: packed runs (bytes) and unpacked numbers
    samples: list[tuple[int, float]] = []
    hist = exemplars = 0
    kind = _UNSPECIFIED
    while pos < stop:
        tag = raw[pos]
        if tag == 0x12 and pos + 18 <= stop and raw[pos + 1] == 0x10 and raw[pos + 2] == 0x09 \
                and raw[pos + 11] == 0x10 and raw[pos + 17] < 0x80 \
                and raw[pos + 12] & raw[pos + 13] & raw[pos + 14] & raw[pos + 15] & raw[pos + 16] & 0x80:
            # a sample as senders write it: the value, then a millisecond timestamp of 6 varint bytes
            ts = ((raw[pos + 12] & 0x7F) | (raw[pos + 13] & 0x7F) << 7 | (raw[pos + 14] & 0x7F) << 14
                  | (raw[pos + 15] & 0x7F) << 21 | (raw[pos + 16] & 0x7F) << 28 | raw[pos + 17] << 35)
            samples.append((ts, _DOUBLE.unpack_from(raw, pos + 3)[0]))
            pos += 18
            continue
        if tag == 0x0A and raw[pos + 1] < 0x80:  # labels_refs, packed, under 128 bytes: inlined
            end = pos + 2 + raw[pos + 1]
            if end > stop:
                raise ProtocolError(f"label references at offset {pos + 2} run past their series")
            parts.append(raw[pos + 2:end])
            pos = end
            continue
        if tag == 0x2A and raw[pos + 1] == 2 and raw[pos + 2] == 0x08 and raw[pos + 3] < 0x80 and pos + 4 <= stop:
            kind = raw[pos + 3]  # metadata holding only its type: inlined
            pos += 4
            continue
        tag, pos = _varint(raw, pos)
        if tag == 0x0A:  # labels_refs, packed (what every encoder writes)
            n, pos = _varint(raw, pos)
            end = pos + n
            if end > stop:
                raise ProtocolError(f"label references at offset {pos} run past their series")
            parts.append(raw[pos:end])
            pos = end
        elif tag == 0x08:  # labels_refs, one unpacked (legal protobuf)
            r, pos = _varint(raw, pos)
            parts.append(r)
        elif tag == 0x12:  # sample
            n, pos = _varint(raw, pos)
            if pos + n > stop:
                raise ProtocolError(f"sample at offset {pos} runs past its series")
            samples.append(_sample(raw, pos, pos + n))
            pos += n
        elif tag == 0x1A:  # native histogram: counted, not decoded (no catalog field is one)
            hist += 1
            pos = _skip(raw, pos, 2)
        elif tag == 0x22:  # exemplar
            exemplars += 1
            pos = _skip(raw, pos, 2)
        elif tag == 0x2A:  # metadata
            n, pos = _varint(raw, pos)
            kind = _metric_type(raw, pos, pos + n)
            pos += n
        else:  # created_timestamp and fields of later 2.x minors
            pos = _skip(raw, pos, tag & 7)
    if pos != stop:
        raise ProtocolError(f"timeseries ending at offset {stop} is malformed")
    if len(parts) == 1 and isinstance(parts[0], bytes):
        packed = parts[0]
        key = labels.key_packed(packed)
    else:  # unpacked references, or several runs (protobuf concatenates them, in order)
        refs: list[int] = []
        for p in parts:
            if isinstance(p, int):
                refs.append(p)
            else:
                refs.extend(_unpack_refs(p))
        key = labels.key(refs)
        packed = b"".join(_pair_bytes(refs[i], refs[i + 1]) for i in range(0, len(refs), 2))
    # An unspecified type says nothing (Prometheus sends it unless metadata WAL records are on):
    # it must not undo what an earlier request's metadata said about the family.
    family = None
    if kind != _UNSPECIFIED and (name := labels.name_of(packed)) is not None:
        family = (name, kind)
    return Series(key, samples, hist), family, exemplars


def _sample(raw: bytes, pos: int, stop: int) -> tuple[int, float]:
    value = 0.0  # proto3 omits zero values
    ts = 0
    while pos < stop:
        tag, pos = _varint(raw, pos)
        if tag == 0x09:
            value = _DOUBLE.unpack_from(raw, pos)[0]
            pos += 8
        elif tag == 0x10:
            ts, pos = _varint(raw, pos)
            if ts >= 1 << 63:
                ts -= _U64
        else:  # start_timestamp (field 3) and later fields
            pos = _skip(raw, pos, tag & 7)
    if pos != stop:
        raise ProtocolError(f"sample ending at offset {stop} is malformed")
    return ts, value


def _metric_type(raw: bytes, pos: int, stop: int) -> int:
    kind = _UNSPECIFIED
    while pos < stop:
        tag, pos = _varint(raw, pos)
        if tag == 0x08:
            kind, pos = _varint(raw, pos)
        else:
            pos = _skip(raw, pos, tag & 7)
    if pos != stop:
        raise ProtocolError(f"metadata ending at offset {stop} is malformed")
    return kind
