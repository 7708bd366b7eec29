"""Rollup rows folded from several batches of the same GPU-minute: the SQL merge (per
dialect) equals the aggregate of the raw rows, also where whole batches lack a field."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from gpufleet.catalog import CATALOG
from gpufleet.storage import retention
from gpufleet.storage.raw_read import raw_records
from gpufleet.storage.write_cache import WriteCache

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from collector.conftest import make_batch, store

T0 = 1_790_000_040.0 - 1_790_000_040.0 % 60  # a minute boundary
KINDS = {}
for f in CATALOG.fields:
    KINDS.setdefault(f.rollup, f.name)


def test_merge_equals_raw_aggregates_with_missing_fields(engine) -> None:  # type: ignore[no-untyped-def]
    names = tuple(KINDS.values())
    retention.ensure_partitions(engine, retention.days_of([T0]))
    cache = WriteCache()
    for seq in range(3):
        b = make_batch("merge-node", seq=seq, start=T0 + 10 * seq + 5, gpus=2, seconds=10, fields=names, seed=seq)
        for name in names:
            if seq != 1:  # batches 0 and 2 lack each field in every other row (different rows)
                col = b.samples[name]
                for r in range(len(col)):
                    if (seq == 0) == (r % 2 == 0):
                        col[r] = None
            if seq == 2 and name == names[0]:
                b.samples[name] = [None] * len(b.samples[name])  # a whole batch without the field
        with engine.begin() as c:
            store(c, [b], T0 + 100, cache)
    with engine.connect() as c:
        raw = raw_records(c)
        roll = [dict(r) for r in c.execute(text("select * from gpu_samples_1m")).mappings()]
    assert len(raw) == 60 and sum(r["n"] for r in roll) == 60
    for r in roll:
        rows = [x for x in raw if x["gpu_pk"] == r["gpu_pk"] and r["bucket"] <= x["ts"] < r["bucket"] + 60]
        for kind, name in KINDS.items():
            vals: list[Any] = [x[name] for x in rows if x[name] is not None]
            if kind == "max":
                assert r[name] == max(vals), name
            elif kind == "last":
                assert r[name] == vals[-1], name
            else:
                # Means merge batch by batch, weighted by the rows each folded in (not by its
                # non-null values): replay exactly that on the raw rows.
                mean, n = None, 0
                for seq in range(3):
                    part = [x for x in rows if T0 + 10 * seq + 5 <= x["ts"] < T0 + 10 * seq + 15]
                    got = [x[name] for x in part if x[name] is not None]
                    w = sum(got) / len(got) if got else None
                    if mean is None or w is None:
                        mean = mean if w is None else w
                    else:
                        mean = (mean * n + w * len(part)) / (n + len(part))
                    n += len(part)
                assert r[name] == pytest.approx(mean, rel=1e-6), name  # float4 columns on PostgreSQL
