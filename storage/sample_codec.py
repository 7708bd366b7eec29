"""One GPU's samples over a time window as one compressed block: ``encode_block(ts, vals)``
and ``decode_block(data) -> (ts, vals)``, lossless for the catalog's dtypes; and
``encode_blocks``, which encodes many blocks at once (the write path's group commit).

Why a block and not a row per sample: a row per GPU-second paid a 24-byte tuple header, 30
nullable columns and index entries for every sample (258 B per GPU-sample); a block pays them
once per GPU per write, and the values of one field over time compress well together
(docs/collector.md has the measurements and the layouts compared).

Layout: one byte naming the compression (``LZ4`` 2 or ``ZSTD`` 1), the number of fields ``nf`` (u8), the number of
samples ``n`` (u32 little-endian), then the compressed ``n`` rows of fixed width:
the timestamp (8 bytes), then each field in catalog order, f4 fields as 4 bytes and the
others (f8, i8) as 8. Each column holds, instead of the value,
the zigzagged difference of its IEEE bit pattern from the previous sample's (wrapping integer
arithmetic, so any bits come back exactly), the timestamp the difference of differences. An
absent value (NaN) is the canonical quiet NaN's bit pattern, so absent stays absent and a field
that is absent or constant throughout is a column of zeros. The rows are stored byte-shuffled
(every row's first byte, then every row's second byte, ...): the runs of zero high bytes that
differencing leaves are what LZ4/zstd compress.

Why bit patterns and not decimal scaling or per-field modes (tried first): this layout is
the same arithmetic for every field and every block, so a group commit's blocks are encoded
with a handful of numpy operations over all its rows; per-block, per-field decisions cost
~3 ms a block in Python, more than the database write they save. f4 values go through
float32 and back, which is exact for the f4-exact values the collector stores.

A catalog that only appends fields decodes old blocks (missing trailing fields are NaN);
a block with more fields than this catalog is refused (``CorruptBlock``).

A (GPU, ts) row may be stored in several blocks, each holding some of its fields (a
remote-write sender's shards deliver one row's fields in separate requests; the later ones
are stored as supplement rows, their already-stored fields absent: ``storage.unique_rows``).
``coalesce`` makes one row of them, field by field, the first present value winning; every
reader of decoded blocks applies it (``raw_read``, ``raw_compact``)."""

from __future__ import annotations

import struct
import threading
from typing import Any

import cramjam
import numpy as np
import zstandard

from gpufleet.storage.fields import FIELDS, NF

# The first byte says how the rows are compressed: LZ4 where the write path encodes (a group
# commit's blocks are a few seconds each; LZ4 took a fifth of zstd's CPU on them, for blocks
# ~8% larger), zstd where compaction merges a closed window (off the hot path, smallest).
LZ4, ZSTD = 2, 1
VERSION = ZSTD  # the first layout's id
_ZLEVEL = 1
_IS_F4 = np.array([f.dtype == "f4" for f in FIELDS])
_WIDTHS = np.where(_IS_F4, 4, 8)
_OFFSETS = 8 + np.concatenate([[0], np.cumsum(_WIDTHS)[:-1]]).astype(int)
# Byte rows of the (width, n) row matrix holding the f4 fields, then the 8-byte ones, each
# field's bytes in order (what ``_bytes_of`` of the stacked fields yields).
_F4_BYTES = np.array([o + b for o, f4 in zip(_OFFSETS.tolist(), _IS_F4, strict=True) if f4 for b in range(4)], int)
_F8_BYTES = np.array([o + b for o, f4 in zip(_OFFSETS.tolist(), _IS_F4, strict=True) if not f4 for b in range(8)], int)
_HEAD = struct.Struct("<BBI")  # version, nf, n
_F4_NAN = np.uint32(0x7FC00000)
_F8_NAN = np.uint64(0x7FF8000000000000)
# zstd contexts are not thread-safe: one pair per thread.
_local = threading.local()


class CorruptBlock(ValueError):
    """A stored block that does not decode (wrong version, truncated, or from a newer catalog)."""


def _codecs() -> tuple[zstandard.ZstdCompressor, zstandard.ZstdDecompressor]:
    c: tuple[zstandard.ZstdCompressor, zstandard.ZstdDecompressor] | None = getattr(_local, "codecs", None)
    if c is None:
        c = (zstandard.ZstdCompressor(level=_ZLEVEL, write_checksum=False, write_content_size=True),
             zstandard.ZstdDecompressor())
        _local.codecs = c
    return c


def row_width(nf: int = NF) -> int:
    """Bytes per sample before compression for the first ``nf`` catalog fields."""
    return 8 + int(_WIDTHS[:nf].sum())


def _diff(bits: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Wrapping difference from the previous element (along the last axis); a block's first
    element keeps its bits."""
    d = bits.copy()
    d[..., 1:] -= bits[..., :-1]
    d[..., first] = bits[..., first]
    return d


def _zigzag(d: np.ndarray) -> np.ndarray:
    signed: np.ndarray = d.view(np.int32 if d.dtype == np.uint32 else np.int64)
    shift = 31 if d.dtype == np.uint32 else 63
    out: np.ndarray = (np.left_shift(signed, 1) ^ np.right_shift(signed, shift)).view(d.dtype)
    return out


def _unzigzag(u: np.ndarray) -> np.ndarray:
    one = u.dtype.type(1)
    out: np.ndarray = np.right_shift(u, one) ^ (np.zeros_like(u) - (u & one))
    return out


def encode_blocks(ts: np.ndarray, vals: np.ndarray, starts: np.ndarray, *, codec: int = LZ4) -> list[bytes]:
    """Blocks of the rows ``[starts[i], starts[i+1])`` (the last to the end). ``ts`` (n,)
    float64 ascending within each block; ``vals`` (NF, n) float64 in catalog order, NaN =
    absent. ``starts`` begins with 0. ``codec``: ``LZ4`` (fast) or ``ZSTD`` (small)."""
    if codec not in (LZ4, ZSTD):
        raise ValueError(f"unknown codec {codec}")
    ts = np.ascontiguousarray(ts, np.float64)
    vals = np.asarray(vals, np.float64)
    n = len(ts)
    if vals.shape != (NF, n):
        raise ValueError(f"vals must be ({NF}, {n}), got {vals.shape}")
    if not n:
        return []
    starts = np.asarray(starts, np.int64)
    if starts[0] != 0 or (np.diff(starts) <= 0).any() or starts[-1] >= n:
        raise ValueError("starts must begin at 0 and increase within the rows")
    first = np.zeros(n, bool)
    first[starts] = True
    # The rows are built column-major, (width, n) bytes: the layout the blocks store (byte-
    # shuffled), so a block is a slice and every field of one kind is differenced and
    # zigzagged in one 2-d numpy operation (a loop over the fields was half of the encode).
    cols = np.empty((row_width(), n), np.uint8)
    tb = ts.view(np.uint64)
    d = _diff(tb, first)
    cols[:8] = _bytes_of(_zigzag(_diff(d, first | np.r_[False, first[:-1]]))[None, :])
    absent = np.isnan(vals)
    with np.errstate(invalid="ignore"):
        f4 = vals[_IS_F4].astype(np.float32).view(np.uint32)
    f4[absent[_IS_F4]] = _F4_NAN
    f8 = vals[~_IS_F4].view(np.uint64).copy()
    f8[absent[~_IS_F4]] = _F8_NAN
    cols[_F4_BYTES] = _bytes_of(_zigzag(_diff(f4, first)))
    cols[_F8_BYTES] = _bytes_of(_zigzag(_diff(f8, first)))
    zstd = _codecs()[0]

    def compress(raw: memoryview) -> Any:  # LZ4 without its size prefix: the header has n
        return zstd.compress(raw) if codec == ZSTD else cramjam.lz4.compress_block(raw, store_size=False)
    out: list[bytes] = []
    for m, shuffled in _shuffled(cols, starts):
        out.append(_HEAD.pack(codec, NF, m) + bytes(compress(shuffled)))
    return out


def _bytes_of(words: np.ndarray) -> np.ndarray:
    """(k, n) little-endian words as (k * size, n) bytes: row ``i * size + b`` is byte ``b``
    of field ``i``'s words (the byte-shuffled order)."""
    k, n = words.shape
    size = words.dtype.itemsize
    return words.astype(words.dtype.newbyteorder("<"), copy=False).view(np.uint8).reshape(k, n, size) \
        .transpose(0, 2, 1).reshape(k * size, n)


def _shuffled(cols: np.ndarray, starts: np.ndarray) -> list[tuple[int, memoryview]]:
    """(rows, the block's bytes column by column) per block, in block order, from the
    (width, n) byte matrix. Blocks of equal length are gathered in one numpy operation, not
    one per block; when every block has that length (the usual group commit: every GPU the
    same seconds) the blocks are a reshape of the matrix, no gather at all."""
    width, n = cols.shape
    sizes = np.diff(np.r_[starts, n])
    res: list[tuple[int, memoryview] | None] = [None] * len(starts)
    for m in np.unique(sizes).tolist():
        which = np.flatnonzero(sizes == m)
        if len(which) * m == n:  # starts are 0, m, 2m, ...
            cube = cols.reshape(width, len(which), m)
        else:
            cube = cols[:, starts[which][:, None] + np.arange(m)]  # (width, blocks, m)
        flat = np.ascontiguousarray(cube.transpose(1, 0, 2)).reshape(-1).data
        step = m * width
        for k, i in enumerate(which.tolist()):
            res[i] = (m, flat[k * step:(k + 1) * step])
    return [r for r in res if r is not None]


def encode_block(ts: np.ndarray, vals: np.ndarray, *, codec: int = LZ4) -> bytes:
    """One block of ``ts`` (n,) ascending and ``vals`` (NF, n), NaN = absent."""
    if not len(ts):
        raise ValueError("a block holds at least one sample")
    return encode_blocks(ts, vals, np.zeros(1, np.int64), codec=codec)[0]


def _open(data: bytes | memoryview) -> tuple[np.ndarray, int, int]:
    """The block's rows as a (width, n) byte matrix, n, nf."""
    if len(data) < _HEAD.size or data[0] not in (LZ4, ZSTD):
        raise CorruptBlock(f"unknown block version {data[0] if len(data) else None}")
    codec, nf, n = _HEAD.unpack_from(data, 0)
    if nf > NF:
        raise CorruptBlock(f"block has {nf} fields, this catalog {NF}: written by a newer gpufleet")
    width = row_width(nf)
    body = bytes(data[_HEAD.size:])
    try:
        if codec == ZSTD:
            payload = _codecs()[1].decompress(body)
        else:
            payload = bytes(cramjam.lz4.decompress_block(body, output_len=n * width))
    except (zstandard.ZstdError, cramjam.DecompressionError) as e:
        raise CorruptBlock(f"block does not decompress: {e}") from e
    if not n or len(payload) != n * width:
        raise CorruptBlock(f"block payload of {len(payload)} bytes is not {n} rows of {width}")
    return np.frombuffer(payload, np.uint8).reshape(width, n), n, nf


def _segment_cumsum(x: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Cumulative sums restarting at each ``first`` position (wrapping unsigned arithmetic,
    so subtracting the running total before each segment is exact)."""
    c = np.cumsum(x, dtype=x.dtype)
    starts = np.flatnonzero(first)
    if len(starts) > 1:
        before = np.zeros(len(starts), x.dtype)
        before[1:] = c[starts[1:] - 1]
        c -= np.repeat(before, np.diff(np.r_[starts, len(x)]))
    return c


def _column(cols: np.ndarray, off: int, w: int) -> np.ndarray:
    return np.ascontiguousarray(cols[off:off + w].T).view(np.uint32 if w == 4 else np.uint64).reshape(-1)


def _times(cols: np.ndarray, first: np.ndarray) -> np.ndarray:
    d = _unzigzag(_column(cols, 0, 8))
    # A block's first entry is its first timestamp's bits, the second its first difference,
    # then differences of differences.
    second = np.r_[False, first[:-1]]
    d = _segment_cumsum(d, first | second)
    return _segment_cumsum(d, first).view(np.float64)


def decode_blocks(blocks: list[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The blocks' samples concatenated: (ts (n,), vals (NF, n), samples per block)."""
    opened = [_open(b) for b in blocks]
    counts = np.array([n for _, n, _ in opened], np.int64)
    if not opened:
        return np.empty(0), np.empty((NF, 0)), counts
    nf = min(f for _, _, f in opened)
    width = row_width(nf)
    cols = np.concatenate([c[:width] for c, _, _ in opened], axis=1)
    first = _block_firsts(counts)
    vals = np.full((NF, cols.shape[1]), np.nan)
    for j in range(nf):
        w = int(_WIDTHS[j])
        bits = _segment_cumsum(_unzigzag(_column(cols, int(_OFFSETS[j]), w)), first)
        vals[j] = bits.view(np.float32) if w == 4 else bits.view(np.float64)
    for k, (_, n, f) in enumerate(opened):
        if f > nf:  # a block from before the catalog grew next to newer ones: decode it alone
            lo = int(counts[:k].sum())
            vals[:, lo:lo + n] = decode_block(blocks[k])[1]
    return _times(cols, first), vals, counts


def decode_times(blocks: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """The blocks' timestamps concatenated and the samples per block, no field decoded (what
    a "which of these rows are stored" question needs; ``decode_blocks`` gives the same ts)."""
    opened = [_open(b) for b in blocks]
    counts = np.array([n for _, n, _ in opened], np.int64)
    if not opened:
        return np.empty(0), counts
    return _times(np.concatenate([c[:8] for c, _, _ in opened], axis=1), _block_firsts(counts)), counts


def _block_firsts(counts: np.ndarray) -> np.ndarray:
    """Over the blocks' samples concatenated: True at each block's first sample."""
    first = np.zeros(int(counts.sum()), bool)
    first[np.r_[0, np.cumsum(counts)[:-1]]] = True
    return first


def coalesce(ts: np.ndarray, gpu_pk: np.ndarray, job_pk: np.ndarray, vals: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One row per (gpu_pk, ts) of rows sorted by (gpu_pk, ts) (equal keys in storage order):
    each field the first present (non-NaN) value of its copies, job_pk the first copy's. Rows
    without a copy come back as they are (the same arrays when no key repeats: one vectorized
    comparison, the readers' steady state)."""
    n = len(ts)
    if n < 2:
        return ts, gpu_pk, job_pk, vals
    again = (gpu_pk[1:] == gpu_pk[:-1]) & (ts[1:] == ts[:-1])
    if not again.any():
        return ts, gpu_pk, job_pk, vals
    starts = np.flatnonzero(np.r_[True, ~again])
    _, out = first_present(vals, starts)
    return ts[starts], gpu_pk[starts], job_pk[starts], out


def first_present(vals: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per field and run of rows (``starts``: each run's first column of ``vals`` (NF, n)):
    the column of the first row holding a value (n where none does) and that value (NaN where
    none does). The one first-value-wins rule of ``coalesce`` and of the write path's copies
    within one write (``unique_rows``)."""
    n = vals.shape[1]
    pos = np.where(np.isnan(vals), n, np.arange(n))
    first = np.minimum.reduceat(pos, starts, axis=1)
    picked = np.take_along_axis(vals, np.minimum(first, n - 1), axis=1)
    return first, np.where(first < n, picked, np.nan)


def decode_block(data: bytes | memoryview) -> tuple[np.ndarray, np.ndarray]:
    """(ts (n,), vals (NF, n)) of a block from ``encode_block``; NaN where absent."""
    ts, vals, _ = decode_blocks([bytes(data)])
    return ts, vals
