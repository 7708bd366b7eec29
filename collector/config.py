"""Collector knobs that ServerSettings does not carry, read from GPUFLEET_* environment
variables (documented in docs/collector.md). Per process: with ``serve --workers N`` every
worker has its own write queue of this size."""

from __future__ import annotations

import os
from dataclasses import dataclass

DAY = 86400.0


def _env(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        v = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number") from None
    if v < 0:
        raise ValueError(f"{name}={raw!r} must not be negative")
    return v


@dataclass(frozen=True)
class CollectorConfig:
    queue_rows: int = 400_000  # rows waiting for the writer before ingest answers 503
    group_rows: int = 50_000  # most rows one group commit takes
    max_age_s: float = 30 * DAY  # samples older than this are rejected (docs/protocol.md; use import)
    max_future_s: float = 300.0  # clock skew tolerated
    retry_after_s: int = 2  # Retry-After on 503
    raw_days: float = 31.0  # raw retention (longer than max_age_s, or late batches land in dropped days)
    rollup_days: float = 400.0  # rollup retention
    maintenance_s: float = 60.0  # partitions ahead, stale jobs
    retention_s: float = 3600.0  # retention pass interval
    import_max_bytes: int = 8 * 1024**3  # POST /api/v1/import body limit (decompressed)
    stale_job_s: float = 300.0

    @classmethod
    def from_env(cls) -> CollectorConfig:
        d = cls()
        return cls(
            queue_rows=int(_env("GPUFLEET_INGEST_QUEUE_ROWS", d.queue_rows)),
            group_rows=int(_env("GPUFLEET_INGEST_GROUP_ROWS", d.group_rows)),
            max_age_s=_env("GPUFLEET_INGEST_MAX_AGE_S", d.max_age_s),
            max_future_s=_env("GPUFLEET_INGEST_MAX_FUTURE_S", d.max_future_s),
            retry_after_s=int(_env("GPUFLEET_INGEST_RETRY_AFTER_S", d.retry_after_s)),
            raw_days=_env("GPUFLEET_RETENTION_RAW_DAYS", d.raw_days),
            rollup_days=_env("GPUFLEET_RETENTION_ROLLUP_DAYS", d.rollup_days),
            maintenance_s=_env("GPUFLEET_MAINTENANCE_INTERVAL_S", d.maintenance_s),
            retention_s=_env("GPUFLEET_RETENTION_INTERVAL_S", d.retention_s),
            import_max_bytes=int(_env("GPUFLEET_IMPORT_MAX_BYTES", d.import_max_bytes)),
        )
