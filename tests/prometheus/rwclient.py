"""Test-side helpers: post a remote-write body the way Prometheus does, and read back what was
stored, counted by (GPU, timestamp) so anything doubled or lost shows."""

from __future__ import annotations

from collections import Counter

import httpx
from sqlalchemy import Engine, text

from gpufleet.collector.remote_write import wire

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
        rows = c.execute(text("select g.uuid, s.ts from gpu_samples s join gpus g on g.id = s.gpu_pk")).all()
    return Counter((u, float(t)) for u, t in rows)


def stored_values(engine: Engine, field: str) -> dict[tuple[str, float], float | None]:
    with engine.connect() as c:
        rows = c.execute(text(f"select g.uuid, s.ts, s.{field} from gpu_samples s join gpus g on g.id = s.gpu_pk"))
        return {(u, float(t)): v for u, t, v in rows}
