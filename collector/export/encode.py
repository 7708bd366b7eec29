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


def _ts_varints(ts_ms: np.ndarray) -> np.ndarray:
    """(n, 6) uint8: the 6-byte varints of ms timestamps in [2^35, 2^42)."""
    t = ts_ms.astype(np.uint64)
    out = np.empty((len(t), 6), np.uint8)
    for k in range(6):
        b = (t >> np.uint64(7 * k)) & np.uint64(0x7F)
        out[:, k] = b | np.uint64(0x80) if k < 5 else b
    return out


def samples_bytes(ts_ms: np.ndarray, values: np.ndarray, rows: np.ndarray | None = None) -> bytes:
    """Encoded Sample fields (tag, length, message) for aligned int64 ms / float64 arrays; with
    ``rows``, ``ts_ms`` holds one timestamp per row and sample i has timestamp ts_ms[rows[i]]
    (a batch has far fewer rows than samples: the varints are computed per row)."""
    n = len(values)
    if n and int(ts_ms.min()) >= _LO and int(ts_ms.max()) < _HI:
        buf = np.empty((n, 18), np.uint8)
        buf[:, 0] = 0x12
        buf[:, 1] = 16
        buf[:, 2] = 0x09
        buf[:, 3:11] = np.ascontiguousarray(values, dtype="<f8").view(np.uint8).reshape(n, 8)
        buf[:, 11] = 0x10
        tv = _ts_varints(ts_ms)
        buf[:, 12:18] = tv if rows is None else tv[rows]
        return buf.tobytes()
    tsv = ts_ms if rows is None else ts_ms[rows]
    return b"".join(wire.encode_sample(int(t), float(v)) for t, v in zip(tsv, values, strict=True))


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
        self._prefix: dict[tuple[tuple[str, str, str, str | None], int, int], bytes] = {}
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
        """Encoded TimeSeries messages (each with its field-1 tag) and their sample count.

        Vectorised over the whole batch: rows sorted by (GPU, job, ts) make every series' samples
        one contiguous run of the field's column, so all samples of all series are encoded by
        one array operation and each series is a slice of that buffer."""
        n = len(src.ts)
        if not n:
            return [], 0
        keys: dict[tuple[str, str | None], int] = {}
        gid = np.fromiter((keys.setdefault(k, len(keys)) for k in zip(src.gpu, src.job, strict=True)),
                          dtype=np.int64, count=n)
        ts_all = np.asarray(src.ts, dtype=np.float64)
        order = np.lexsort((ts_all, gid))  # by series, then time: receivers want a series' samples in order
        gsorted = gid[order]
        ts_ms = np.rint(ts_all[order] * 1000.0).astype(np.int64)
        rows = [j for j, _ in self.fields]
        vals = src.vals[rows][:, order]  # (exported fields, n), rows grouped by series
        ok = ~np.isnan(vals)
        if not ok.any():
            return [], 0
        fi, ri = np.nonzero(ok)  # field-major: series (field, group) are contiguous runs
        buf = samples_bytes(ts_ms, vals[fi, ri], ri)
        series_id = fi * len(keys) + gsorted[ri]
        cuts = np.flatnonzero(np.diff(series_id)) + 1
        starts = np.concatenate(([0], cuts))
        ends = np.concatenate((cuts, [len(series_id)]))
        fixed = len(buf) == 18 * len(series_id)
        per = None if fixed else [wire.encode_sample(int(t), float(v))
                                  for t, v in zip(ts_ms[ri], vals[fi, ri], strict=True)]
        groups = list(keys)
        ng = len(groups)
        gkeys = [(src.cluster, src.node, u, j) for u, j in groups]
        parts: list[bytes] = []
        prefix = self._prefix
        sids = series_id[starts].tolist()
        for a, b, sid in zip(starts.tolist(), ends.tolist(), sids, strict=True):
            f, g = divmod(sid, ng)
            key = (gkeys[g], f, b - a)
            head = prefix.get(key)
            if fixed:
                if head is None:  # tag + length + labels: the same for every batch of this shape
                    uuid, job = groups[g]
                    labels = self._labels(src, uuid, job, self.fields[f][1])
                    head = self._head(labels, 18 * (b - a)) + labels
                    if len(prefix) >= self.max_cached:
                        prefix.clear()
                    prefix[key] = head
                parts.append(head)
                parts.append(buf[18 * a:18 * b])
            else:
                uuid, job = groups[g]
                labels = self._labels(src, uuid, job, self.fields[f][1])
                body = b"".join(per[a:b])  # type: ignore[index]  # per is set on this (non-fixed) path
                parts.append(self._head(labels, len(body)) + labels)
                parts.append(body)
        return [b"".join(parts)], len(series_id)

    @staticmethod
    def _head(labels: bytes, body_len: int) -> bytes:
        h = bytearray(b"\x0a")
        wire.put_varint(h, len(labels) + body_len)
        return bytes(h)
