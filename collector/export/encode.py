"""Stored rows -> remote-write series: pure, vectorised where it counts.

A series is (metric ``gpufleet_<field>``, the configured labels of its GPU and job). Its labels'
encoding is cached; its samples are encoded with numpy: a sample whose timestamp lies between
1971 and 2109 in milliseconds (a 6-byte varint) has a fixed 18-byte encoding, so a column of
them is one array operation instead of a Python call per value. NaN (not available) is never
exported: a missing reading stays missing downstream too."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from gpufleet.catalog import CATALOG
from gpufleet.collector.remote_write import wire

LABELS = ("cluster", "node", "gpu", "uuid", "job", "user")
PREFIX = "gpufleet_"
_NAMES = CATALOG.names
_LO, _HI = 1 << 35, 1 << 42  # ms timestamps whose varint is exactly 6 bytes


@dataclass(frozen=True, slots=True)
class RowSource:
    """What one stored batch contributes: the fields of ``vals`` (rows of ``CATALOG.names``)."""

    cluster: str
    node: str
    ts: np.ndarray  # epoch seconds
    gpu: Sequence[str]
    job: Sequence[str | None]
    vals: np.ndarray
    gpu_index: dict[str, int]
    job_user: dict[str, str | None]


def samples_bytes(ts_ms: np.ndarray, values: np.ndarray) -> bytes:
    """Encoded Sample fields (tag, length, message) for aligned int64 ms / float64 arrays."""
    n = len(ts_ms)
    if n and int(ts_ms.min()) >= _LO and int(ts_ms.max()) < _HI:
        buf = np.empty((n, 18), np.uint8)
        buf[:, 0] = 0x12
        buf[:, 1] = 16
        buf[:, 2] = 0x09
        buf[:, 3:11] = np.ascontiguousarray(values, dtype="<f8").view(np.uint8).reshape(n, 8)
        buf[:, 11] = 0x10
        t = ts_ms.astype(np.uint64)
        for k in range(6):
            b = (t >> np.uint64(7 * k)) & np.uint64(0x7F)
            buf[:, 12 + k] = b | np.uint64(0x80) if k < 5 else b
        return buf.tobytes()
    return b"".join(wire.encode_sample(int(t), float(v)) for t, v in zip(ts_ms, values, strict=True))


class Encoder:
    def __init__(self, fields: Iterable[str] | None = None, labels: Iterable[str] = LABELS,
                 max_cached: int = 100_000) -> None:
        names = list(fields) if fields is not None else list(_NAMES)
        unknown = [f for f in names if f not in CATALOG]
        if unknown:
            raise ValueError(f"export fields {unknown} are not catalog fields (see gpufleet/catalog.toml)")
        bad = [x for x in labels if x not in LABELS]
        if bad:
            raise ValueError(f"export labels {bad} not among {', '.join(LABELS)}")
        self.fields = [(_NAMES.index(f), f) for f in names]
        self.labels = tuple(labels)
        self._cache: dict[tuple[str, str, str, str | None, str], bytes] = {}
        self.max_cached = max_cached

    def _labels(self, src: RowSource, uuid: str, job: str | None, field: str) -> bytes:
        key = (src.cluster, src.node, uuid, job, field)
        hit = self._cache.get(key)
        if hit is None:
            have = {"cluster": src.cluster, "node": src.node, "uuid": uuid,
                    "gpu": str(src.gpu_index[uuid]) if uuid in src.gpu_index else "",
                    "job": job or "", "user": (src.job_user.get(job) or "") if job else ""}
            pairs = [("__name__", PREFIX + field)] + [(k, have[k]) for k in self.labels if have[k]]
            hit = wire.encode_labels(pairs)
            if len(self._cache) >= self.max_cached:
                self._cache.clear()
            self._cache[key] = hit
        return hit

    def series(self, src: RowSource) -> tuple[list[bytes], int]:
        """Encoded TimeSeries messages (each with its field-1 tag) and their sample count."""
        groups: dict[tuple[str, str | None], list[int]] = {}
        for i, key in enumerate(zip(src.gpu, src.job, strict=True)):
            g = groups.get(key)
            if g is None:
                groups[key] = [i]
            else:
                g.append(i)
        ts_ms = np.rint(np.asarray(src.ts, dtype=np.float64) * 1000.0).astype(np.int64)
        out: list[bytes] = []
        count = 0
        for (uuid, job), rows in groups.items():
            idx = np.asarray(rows)
            t = ts_ms[idx]
            for j, name in self.fields:
                v = src.vals[j, idx]
                ok = ~np.isnan(v)
                if not ok.any():
                    continue
                if not ok.all():
                    body = samples_bytes(t[ok], v[ok])
                    k = int(ok.sum())
                else:
                    body = samples_bytes(t, v)
                    k = len(v)
                msg = self._labels(src, uuid, job, name) + body
                head = bytearray(b"\x0a")
                wire.put_varint(head, len(msg))
                out.append(bytes(head) + msg)
                count += k
        return out, count
