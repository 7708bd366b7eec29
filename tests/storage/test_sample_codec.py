"""storage/sample_codec.py: blocks decode to exactly what was encoded (f4 values f4-exact,
integers exact, NaN = absent stays absent, any timestamps), one block or many at once, and a
damaged block is refused with a clear error instead of decoding to wrong values."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.storage.fields import FIELDS, NF
from gpufleet.storage.sample_codec import (
    LZ4,
    ZSTD,
    CorruptBlock,
    decode_block,
    decode_blocks,
    encode_block,
    encode_blocks,
    row_width,
)


def _bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal bit for bit where present, absent (NaN) in the same places."""
    nan = np.isnan(a)
    return bool(np.array_equal(nan, np.isnan(b)) and np.array_equal(a[~nan].view(np.uint64), b[~nan].view(np.uint64)))


def _values(rng: np.random.Generator, n: int, absent: float) -> np.ndarray:
    vals = np.empty((NF, n))
    for j, f in enumerate(FIELDS):
        if f.dtype == "f4":
            vals[j] = rng.uniform(f.min, min(f.max, 1e6), n).astype(np.float32)
        elif f.dtype == "i8":
            vals[j] = rng.integers(0, int(min(f.max, 2**52)), n, endpoint=True)
        else:
            vals[j] = rng.uniform(f.min, f.max, n)
        vals[j][rng.random(n) < absent] = np.nan
    return vals


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 300), seed=st.integers(0, 2**32 - 1), absent=st.sampled_from([0.0, 0.3, 1.0]),
       rate=st.sampled_from([1.0, 0.1, 0.001, 17.25]))
def test_round_trip_is_exact(n: int, seed: int, absent: float, rate: float) -> None:
    rng = np.random.default_rng(seed)
    ts = 1.7e9 + np.cumsum(rng.uniform(0.5, 1.5, n) * rate) if seed % 2 else 1.7e9 + np.arange(n) * rate
    vals = _values(rng, n, absent)
    for codec in (LZ4, ZSTD):
        got_ts, got = decode_block(encode_block(ts, vals, codec=codec))
        assert np.array_equal(got_ts.view(np.uint64), ts.view(np.uint64))
        assert _bits_equal(got, vals)


def test_extreme_values_and_signed_zero_survive() -> None:
    f4 = next(j for j, f in enumerate(FIELDS) if f.dtype == "f4")
    f8 = next(j for j, f in enumerate(FIELDS) if f.dtype == "f8")
    i8 = next(j for j, f in enumerate(FIELDS) if f.dtype == "i8")
    vals = np.full((NF, 6), np.nan)
    vals[f4] = np.array([0.0, -0.0, 1e-45, 3.4028235e38, -40.0, 0.1], np.float32)
    vals[f8] = [0.0, -0.0, 5e-324, 1.7976931348623157e308, -1e300, 0.1]
    vals[i8] = [0, 2**53, 1, 2**53 - 1, 4294967295, 0]
    ts = np.array([0.0, 1e-6, 1.0, 1e9, 2e9 + 0.123456, 4e9])
    got_ts, got = decode_block(encode_block(ts, vals))
    assert np.array_equal(got_ts.view(np.uint64), ts.view(np.uint64))
    assert _bits_equal(got, vals)


def test_many_blocks_at_once_equal_one_at_a_time() -> None:
    rng = np.random.default_rng(3)
    sizes = [1, 7, 60, 2, 600]
    ts = np.concatenate([1.7e9 + k * 1e4 + np.arange(s, dtype=np.float64) for k, s in enumerate(sizes)])
    vals = _values(rng, len(ts), 0.1)
    starts = np.r_[0, np.cumsum(sizes)[:-1]]
    blocks = encode_blocks(ts, vals, starts)
    assert len(blocks) == len(sizes)
    for b, lo, s in zip(blocks, starts, sizes, strict=True):
        one = encode_block(ts[lo:lo + s], vals[:, lo:lo + s])
        assert b == one
    zblocks = encode_blocks(ts, vals, starts, codec=ZSTD)
    assert [decode_block(b)[0].tolist() for b in zblocks] == [decode_block(b)[0].tolist() for b in blocks]
    got_ts, got, counts = decode_blocks(blocks)
    assert counts.tolist() == sizes
    assert np.array_equal(got_ts, ts) and _bits_equal(got, vals)


def test_constant_and_absent_fields_cost_almost_nothing() -> None:
    n = 600
    ts = 1.7e9 + np.arange(n, dtype=np.float64)
    vals = np.full((NF, n), np.nan)
    vals[:10] = 0.5
    assert len(encode_block(ts, vals, codec=ZSTD)) < n * row_width() / 100  # runs of zeros
    assert len(encode_block(ts, vals, codec=LZ4)) < n * row_width() / 40


@pytest.mark.parametrize("damage", ["version", "truncated", "lz4", "bitflip", "newer_catalog", "empty", "rows"])
def test_damaged_blocks_are_refused(damage: str) -> None:
    rng = np.random.default_rng(1)
    good = bytearray(encode_block(1.7e9 + np.arange(20.0), _values(rng, 20, 0.1), codec=ZSTD))
    if damage == "version":
        good[0] = 99
    elif damage == "lz4":
        good = bytearray(encode_block(1.7e9 + np.arange(20.0), _values(rng, 20, 0.1), codec=LZ4))
        good = good[:len(good) - 7]
    elif damage == "truncated":
        good = good[:len(good) // 2]
    elif damage == "bitflip":
        good[7] ^= 0x40  # zstd's frame magic (the values carry no checksum: PostgreSQL's pages do)
    elif damage == "newer_catalog":
        good[1] = NF + 1
    elif damage == "empty":
        good = bytearray()
    else:
        good[1] = NF - 1  # fewer fields than written: the payload is not whole rows of that width
    with pytest.raises(CorruptBlock):
        decode_block(bytes(good))


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="vals must be"):
        encode_block(np.arange(3.0), np.zeros((NF - 1, 3)))
    with pytest.raises(ValueError, match="at least one"):
        encode_block(np.empty(0), np.empty((NF, 0)))
    with pytest.raises(ValueError, match="starts"):
        encode_blocks(np.arange(3.0), np.zeros((NF, 3)), np.array([1]))
