"""Test-side helpers: post a remote-write body the way Prometheus does, and read back what was
stored, counted by (GPU, timestamp) so anything doubled or lost shows."""

from __future__ import annotations

from collections import Counter

import httpx
from sqlalchemy import Engine

from gpufleet.collector.remote_write import wire
from tests.raw_samples_helpers import uuid_keys, uuid_records

HEADERS = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy",
           "X-Prometheus-Remote-Write-Version": "0.1.0", "User-Agent": "gpufleet-test"}


def post(url: str, raw: bytes, token: str | None = None, **headers: str) -> httpx.Response:
    h = dict(HEADERS, **headers)
    if token:
        h["Authorization"] = f"Bearer {token}"
    return httpx.post(url + "/api/v1/write", content=wire.snappy(raw), headers=h, timeout=30)


def stored(engine: Engine) -> Counter[tuple[str, float]]:
    """Raw rows by (GPU uuid, ts): a count above 1 is a doubled row."""
    with engine.connect() as c:
        return Counter(uuid_keys(c))


def stored_values(engine: Engine, field: str) -> dict[tuple[str, float], float | None]:
    with engine.connect() as c:
        return {(r["uuid"], r["ts"]): r[field] for r in uuid_records(c)}
