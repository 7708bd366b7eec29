"""bench/remote_write/export_cost.py's sink counts a body's samples by decoding it
(rw_count.c), not by a byte pattern: its count equals the project's decoder's on real export
bodies, a label or a value holding an encoded Sample's bytes is not a sample, and a truncated
or malformed body is refused, not counted."""

from __future__ import annotations

import shutil
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

from gpufleet.catalog import CATALOG
from gpufleet.collector.export.encode import Encoder, RowSource
from gpufleet.collector.remote_write import wire

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "remote_write"))

import export_cost


@pytest.fixture(scope="module")
def count(tmp_path_factory):
    if shutil.which("cc") is None:
        pytest.fail("no C compiler: the sink would fall back to wire.decode (the bench needs cc)")
    name, fn = export_cost.sample_counter(tmp_path_factory.mktemp("rwc"))
    assert name == "rw_count.c"
    return lambda raw: fn(memoryview(bytearray(raw)))


def test_counts_equal_the_decoders_on_export_bodies(count) -> None:
    rng = np.random.default_rng(7)
    n = 300
    vals = rng.random((len(CATALOG.names), n))
    vals[rng.random(vals.shape) < 0.3] = np.nan
    src = RowSource(cluster="c", node="n", ts=1.7e9 + np.arange(n) / 8, gpu=[f"GPU-{k % 8}" for k in range(n)],
                    job=["j"] * n, vals=vals, gpu_index={f"GPU-{k}": k for k in range(8)}, job_user={"j": "u"})
    raw, samples = Encoder().encode([src])
    assert samples == int((~np.isnan(vals)).sum())
    assert count(raw) == samples == sum(len(s.samples) for s in wire.decode(raw).series)
    assert count(b"") == 0


def test_a_labels_or_values_sample_bytes_are_not_samples(count) -> None:
    lookalike = b"\x12\x10\x09"  # an encoded Sample's first bytes, which the byte scan counted
    labels = wire.encode_labels([("__name__", "x"), ("node", "n" + lookalike.decode("latin-1"))])
    value = struct.unpack("<d", b"\x00" + lookalike + b"\x00\x00\x00\x00")[0]
    raw = wire.encode([(labels, [(1_700_000_000_000, value), (1_700_000_001_000, 1.0)])])
    assert raw.count(lookalike) > 2
    assert count(raw) == 2 == sum(len(s.samples) for s in wire.decode(raw).series)


def test_truncated_or_malformed_bodies_are_refused(count) -> None:
    raw = wire.encode([(wire.encode_labels([("__name__", "x")]), [(1_700_000_000_000, 1.0)])])
    for bad in (raw[:-1], raw[:3], raw + b"\x0a\x05", b"\x0b" + raw[1:], b"\xff" * 11):
        with pytest.raises(ValueError, match="malformed"):
            count(bad)
