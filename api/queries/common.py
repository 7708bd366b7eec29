"""Helpers every query module uses: time parsing, cursors, cluster lookup, live values."""

from __future__ import annotations

import base64
import binascii
import json
import math
import time
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Double, case, cast, func, select
from sqlalchemy.orm import Session

from gpufleet import durations
from gpufleet.storage.models import Cluster, gpu_samples_1m

DEFAULT_CLUSTER = "default"
# A GPU with no rollup newer than this is shown as "no data", not with stale numbers.
LIVE_WINDOW_S = 300.0
LIVE_FIELDS = ("sm_active", "tensor_active", "dram_active", "power_w", "temp_c", "sm_clock_mhz",
               "fb_used_bytes", "fb_total_bytes", "clock_event_reasons")



class BadRequest(ValueError):
    """A user-supplied argument is invalid; handlers turn it into 400 with this message."""


def now() -> float:
    return time.time()


def parse_duration(text: str, *, name: str = "window", max_s: float = 90 * 86400) -> float:
    try:
        secs = durations.parse_duration(text)  # the one grammar (gpufleet/durations.py)
    except ValueError:
        raise BadRequest(f"{name}={text!r}: use a duration like 30m, 24h or 7d") from None
    if not 0 < secs <= max_s:
        raise BadRequest(f"{name}={text!r}: must be between 1s and {max_s / 86400:g}d")
    return secs


def parse_time(text: str | None, *, name: str) -> float | None:
    """Epoch seconds, ISO-8601 (naive = UTC), or a past offset like ``-24h``."""
    if text is None or text == "":
        return None
    t = text.strip()
    if t.startswith("-"):
        return now() - parse_duration(t[1:], name=name, max_s=3650 * 86400)
    try:
        v = float(t)
    except ValueError:
        try:
            dt = datetime.fromisoformat(t.replace("Z", "+00:00"))
        except ValueError:
            raise BadRequest(f"{name}={text!r}: use epoch seconds, ISO-8601 or -24h") from None
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=UTC)
        return dt.timestamp()
    if not math.isfinite(v) or not 0 <= v < 1e11:
        raise BadRequest(f"{name}={text!r}: not a plausible epoch time")
    return v


def encode_cursor(values: Sequence[Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(values), separators=(",", ":")).encode()).decode().rstrip("=")


def decode_cursor(cursor: str | None, n: int) -> list[Any] | None:
    if not cursor:
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        vals = json.loads(raw)
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise BadRequest("cursor is not one this API issued; start again without it") from None
    if not isinstance(vals, list) or len(vals) != n:
        raise BadRequest("cursor is not one this API issued; start again without it")
    for v in vals:
        if isinstance(v, float) and not math.isfinite(v):
            raise BadRequest("cursor is not one this API issued")
        if not (v is None or isinstance(v, (int, float, str))) or isinstance(v, bool):
            raise BadRequest("cursor is not one this API issued")
    return vals


def cluster_id(conn: Connection | Session, name: str) -> int | None:
    return conn.execute(select(Cluster.id).where(Cluster.name == name)).scalar()


def clean(v: Any, digits: int = 4) -> Any:
    """JSON-safe number: NaN/inf -> None, floats rounded so payloads stay small."""
    if v is None:
        return None
    if isinstance(v, float):
        if not math.isfinite(v):
            return None
        return round(v, digits) if abs(v) < 1e6 else round(v)
    return v


def live_values(conn: Connection | Session, gpu_pks: Iterable[int],
                at: float | None = None) -> dict[int, dict[str, Any]]:
    """The newest 1-minute rollup per GPU (within LIVE_WINDOW_S of ``at``).

    Reads only the last few minutes of each GPU through the (gpu_pk, bucket) index (about 5
    rows per GPU) and keeps the newest in Python: portable, and on PostgreSQL the bucket range
    also prunes the query to today's partition."""
    pks = list(gpu_pks)
    if not pks:
        return {}
    at = at if at is not None else now()
    t = gpu_samples_1m
    cols = [t.c.gpu_pk, t.c.bucket, *(t.c[f] for f in LIVE_FIELDS)]
    newest: dict[int, tuple[Any, ...]] = {}
    for i in range(0, len(pks), 900):  # stay under SQLite's bound-parameter limit
        q = select(*cols).where(t.c.gpu_pk.in_(pks[i:i + 900]), t.c.bucket >= at - LIVE_WINDOW_S, t.c.bucket <= at)
        for r in conn.execute(q):
            old = newest.get(r[0])
            if old is None or r[1] > old[1]:
                newest[r[0]] = r
    names = ("bucket", *LIVE_FIELDS)
    return {pk: {k: clean(v) for k, v in zip(names, r[1:], strict=True)} for pk, r in newest.items()}


def rollup_mean(col: Any, n: Any) -> Any:
    """The mean of a field over minute-rollup rows, each weighted by its samples (``n``). A
    plain avg() weighs a job's first and last, partial, minutes as whole ones: a real H200 job
    of 80 s read 0.33 Tensor-active that way against 0.37 over its stored seconds."""
    weight = func.sum(case((col.is_not(None), n), else_=0))
    return func.sum(cast(col, Double) * n) / func.nullif(weight, 0)

