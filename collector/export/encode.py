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


# One encoded Sample field as three overlapping little-endian words, so that a column of them is
# three array assignments instead of one per byte: bytes 0-2 the field tag, length 16 and the
# value's tag, 3-10 the double, 10-17 (overlapping the double's last byte, written last and
# carrying it) the timestamp's tag and its 6-byte varint.
_SAMPLE = np.dtype({"names": ["head", "value", "tail"], "formats": ["<u4", "<f8", "<u8"],
                    "offsets": [0, 3, 10], "itemsize": 18})
_HEAD = np.uint32(0x12 | 16 << 8 | 0x09 << 16)
_CONT = np.uint64(0x80_8080_8080)  # the continuation bits of the varint's first 5 bytes


def _ts_varints(ts_ms: np.ndarray) -> np.ndarray:
    """uint64: the 6-byte varints of ms timestamps in [2^35, 2^42), as little-endian words."""
    t = ts_ms.astype(np.uint64)
    out = np.full(len(t), _CONT, np.uint64)
    for k in range(6):
        out |= ((t >> np.uint64(7 * k)) & np.uint64(0x7F)) << np.uint64(8 * k)
    return out


def samples_bytes(ts_ms: np.ndarray, values: np.ndarray, rows: np.ndarray | None = None) -> bytes:
    """Encoded Sample fields (tag, length, message) for aligned int64 ms / float64 arrays; with
    ``rows``, ``ts_ms`` holds one timestamp per row and sample i has timestamp ts_ms[rows[i]]
    (a batch has far fewer rows than samples: the varints are computed per row)."""
    n = len(values)
    if n and int(ts_ms.min()) >= _LO and int(ts_ms.max()) < _HI:
        buf = np.empty(n, _SAMPLE)
        buf["head"] = _HEAD
        v = np.ascontiguousarray(values, dtype="<f8")
        buf["value"] = v
        tv = _ts_varints(ts_ms)
        buf["tail"] = (v.view("<u8") >> np.uint64(56)) | np.uint64(0x10 << 8) | (
            (tv if rows is None else tv[rows]) << np.uint64(16))
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
        self._cache: dict[tuple[str, str, str, str | None], list[bytes]] = {}
        self.max_cached = max_cached

    def _labels(self, src: RowSource, uuid: str, job: str | None, field: str) -> bytes:
        have = {"cluster": src.cluster, "node": src.node, "uuid": uuid,
                "gpu": str(src.gpu_index[uuid]) if uuid in src.gpu_index else "",
                "job": job or "", "user": (src.job_user.get(job) or "") if job else ""}
        return wire.encode_labels([("__name__", PREFIX + field)] + [(k, have[k]) for k in self.labels if have[k]])

    def series(self, src: RowSource) -> tuple[list[bytes], int]:
        """Encoded TimeSeries messages (each with its field-1 tag) and their sample count."""
        body, n = self.encode([src])
        return ([body] if n else []), n

    def encode(self, srcs: Sequence[RowSource]) -> tuple[bytes, int]:
        """The TimeSeries messages of several sources (a WriteRequest's body, uncompressed) and
        their sample count.

        Vectorised over all of them at once (the per-call cost of numpy is paid once per body,
        not once per 80-row batch): rows sorted by (source, GPU, job, ts) make every series'
        samples one contiguous run of the field's column, so all samples of all series are
        encoded by one array operation and each series is a view of that buffer; the series
        are joined from C-level maps over their pieces, with no Python frame per series."""
        srcs = [x for x in srcs if len(x.ts)]
        if not srcs:
            return b"", 0
        keys: dict[tuple[int, str, str | None], int] = {}
        gid = np.concatenate([np.fromiter((keys.setdefault((k, g, j), len(keys))
                                           for g, j in zip(x.gpu, x.job, strict=True)), dtype=np.int64, count=len(x.ts))
                              for k, x in enumerate(srcs)])
        ts_all = np.concatenate([np.asarray(x.ts, dtype=np.float64) for x in srcs])
        order = np.lexsort((ts_all, gid))  # by series, then time: receivers want a series' samples in order
        gsorted = gid[order]
        ts_ms = np.rint(ts_all[order] * 1000.0).astype(np.int64)
        rows = [j for j, _ in self.fields]
        vals = np.concatenate([x.vals[rows] for x in srcs], axis=1)[:, order]  # (exported fields, n)
        ok = ~np.isnan(vals)
        if not ok.any():
            return b"", 0
        fi, ri = np.nonzero(ok)  # field-major: series (field, group) are contiguous runs
        buf = samples_bytes(ts_ms, vals[fi, ri], ri)
        series_id = fi * len(keys) + gsorted[ri]
        cuts = np.flatnonzero(np.diff(series_id)) + 1
        starts = np.concatenate(([0], cuts))
        if len(buf) == 18 * len(series_id):
            at = 18 * np.append(starts, len(series_id))  # byte offsets of each series' samples
        else:  # odd timestamps (before 1971, after 2109): per-sample lengths vary
            lens = np.fromiter((len(wire.encode_sample(int(t), 0.0)) for t in ts_ms[ri]), np.int64, len(ri))
            at = np.concatenate(([0], np.cumsum(lens)))[np.append(starts, len(series_id))]
        groups = list(keys)
        ng = len(groups)
        # every piece by a C-level map (no Python frame per series): a series is its head
        # (tag + length varint), its label bytes (cached per GPU, job and field) and a view of
        # its samples in ``buf``
        table = [lab for k, u, j in groups for lab in self._group_labels(srcs[k], u, j)]
        sid = series_id[starts]
        label_ix = ((sid % ng) * len(self.fields) + sid // ng).tolist()
        labels = list(map(table.__getitem__, label_ix))
        label_len = np.fromiter(map(len, labels), np.int64, len(labels))
        size = label_len + np.diff(at)
        uniq, inv = np.unique(size, return_inverse=True)
        heads = [self._head(x) for x in uniq.tolist()]
        mv = memoryview(buf)
        parts: list[bytes | memoryview] = [b""] * (3 * len(labels))
        parts[0::3] = map(heads.__getitem__, inv.tolist())
        parts[1::3] = labels
        parts[2::3] = map(mv.__getitem__, map(slice, at[:-1].tolist(), at[1:].tolist()))
        return b"".join(parts), len(series_id)

    def _group_labels(self, src: RowSource, uuid: str, job: str | None) -> list[bytes]:
        """The label bytes of each exported field's series of one GPU and job."""
        key = (src.cluster, src.node, uuid, job)
        hit = self._cache.get(key)
        if hit is None:
            hit = [self._labels(src, uuid, job, f) for _, f in self.fields]
            if len(self._cache) * len(self.fields) >= self.max_cached:  # max_cached counts series
                self._cache.clear()
            self._cache[key] = hit
        return hit

    @staticmethod
    def _head(size: int) -> bytes:
        """TimeSeries' field tag and the length of a message of ``size`` bytes."""
        h = bytearray(b"\x0a")
        wire.put_varint(h, size)
        return bytes(h)
