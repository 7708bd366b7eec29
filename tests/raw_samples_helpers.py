"""Test helpers over the raw sample store (storage/raw_read.py): counts and (GPU uuid, ts)
keys, read through the one decoder like every other reader."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from gpufleet.storage.db import make_engine
from gpufleet.storage.raw_read import count_raw_samples, raw_records


def raw_count(url: str) -> int:
    e = make_engine(url)
    try:
        with e.connect() as c:
            return count_raw_samples(c)
    finally:
        e.dispose()


def uuid_records(c: sa.Connection) -> list[dict[str, Any]]:
    """Every raw sample as a dict (``raw_records``) with its GPU's ``uuid`` added."""
    uuids = dict(c.execute(sa.text("select id, uuid from gpus")).all())
    return [{**r, "uuid": uuids[r["gpu_pk"]]} for r in raw_records(c)]


def uuid_keys(c: sa.Connection) -> list[tuple[str, float]]:
    """(GPU uuid, ts) of every stored raw sample (repeats kept, so a test can count them)."""
    return [(r["uuid"], r["ts"]) for r in uuid_records(c)]
