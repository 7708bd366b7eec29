"""Stored rows -> remote-write series: pure, vectorised where it counts.

A series is (metric ``gpufleet_<field>``, the configured labels of its GPU and job). Its labels'
encoding is cached; its samples are encoded with numpy: a sample whose timestamp lies between
1971 and 2109 in milliseconds (a 6-byte varint) has a fixed 18-byte encoding, so a column of
them is three array assignments instead of a Python call per value, and a GPU's series but for
their sample bytes (heads and labels) are a cached layout the samples are scattered into.
NaN (not available) is never exported: a missing reading stays missing downstream too."""

from __future__ import annotations

import functools
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


_AR18 = np.arange(18, dtype=np.int64)


@functools.lru_cache(maxsize=1024)
def _zeros(n: int) -> bytes:
    """The hole a series' samples are written into (shared by every layout of that size)."""
    return bytes(n)


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
        self._layouts: dict[tuple[str, str, str, str | None, bytes], tuple[list[bytes], np.ndarray]] = {}
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
        not once per 80-row batch). Rows sorted by (source, GPU, job, ts) and taken field by
        field within each GPU make every series' samples one contiguous run, encoded by one
        array operation. A GPU's series, but for the sample bytes, depend only on its labels
        and its samples per field: that byte layout is cached per (GPU, job, counts) (an
        agent's batches repeat it), the body is the join of its GPUs' layouts and the samples
        are written into the holes by one scatter; no Python frame per series."""
        srcs = [x for x in srcs if len(x.ts)]
        if not srcs:
            return b"", 0
        groups: list[tuple[int, str, str | None]] = []  # (source, GPU, job) by group id
        ids = []
        for k, x in enumerate(srcs):
            of = dict.fromkeys(zip(x.gpu, x.job, strict=True), 0)  # unique (GPU, job) in order, at C speed
            for key in of:  # a source's GPUs in order of appearance: few
                of[key] = len(groups)
                groups.append((k, *key))
            ids.append(np.fromiter(map(of.__getitem__, zip(x.gpu, x.job, strict=True)), np.int64, len(x.ts)))
        gid = np.concatenate(ids)
        ts_all = np.concatenate([np.asarray(x.ts, dtype=np.float64) for x in srcs])
        order = np.lexsort((ts_all, gid))  # by series, then time: receivers want a series' samples in order
        ts_ms = np.rint(ts_all[order] * 1000.0).astype(np.int64)
        rows = [j for j, _ in self.fields]
        vals = np.concatenate([x.vals[rows] for x in srcs], axis=1)[:, order]  # (exported fields, n)
        nf, n = vals.shape
        ng = len(groups)
        bounds = np.searchsorted(gid[order], np.arange(ng + 1))  # each GPU's rows
        # indexes into vals.ravel() in (GPU, field, time) order: one run per (GPU, field)
        run = np.repeat(np.diff(bounds), nf)
        first = np.cumsum(run) - run
        starts = (np.arange(nf)[None, :] * n + bounds[:-1, None]).ravel()
        idx = np.repeat(starts - first, run) + np.arange(nf * n)
        flat = vals.ravel()[idx]
        ok = ~np.isnan(flat)  # NaN (not available) is never exported
        counts = run
        if not ok.all():
            counts = np.add.reduceat(ok, first, dtype=np.int64) if len(ok) else run
            idx, flat = idx[ok], flat[ok]
        if not len(flat):
            return b"", 0
        cols = idx % n  # each sample's row, for its timestamp
        cnt = counts.reshape(ng, nf)
        buf = samples_bytes(ts_ms, flat, cols)
        if len(buf) != 18 * len(flat):  # odd timestamps (before 1971, after 2109): sizes vary
            return self._plain(srcs, groups, cnt, ts_ms[cols], flat), len(flat)
        parts: list[bytes] = []
        head_len = np.empty((ng, nf), np.int64)
        for g, (k, u, j) in enumerate(groups):
            hit = self._layout(srcs[k], u, j, cnt[g])
            parts += hit[0]
            head_len[g] = hit[1]
        out = bytearray(b"".join(parts))
        size = head_len.ravel() + 18 * counts
        region = np.cumsum(size) - size + head_len.ravel()  # where each series' samples go
        firsts = np.cumsum(counts) - counts
        at = np.repeat(region - 18 * firsts, counts) + 18 * np.arange(len(flat))
        np.frombuffer(out, np.uint8)[at[:, None] + _AR18] = np.frombuffer(buf, np.uint8).reshape(-1, 18)
        return bytes(out), len(flat)

    def _layout(self, src: RowSource, uuid: str, job: str | None, counts: np.ndarray) -> tuple[list[bytes], np.ndarray]:
        """A GPU's series with ``counts`` samples per field: [head + labels, zeroed sample bytes]
        per present field, and each field's head + labels length (0 when absent)."""
        key = (src.cluster, src.node, uuid, job, counts.tobytes())
        hit = self._layouts.get(key)
        if hit is None:
            pieces: list[bytes] = []
            lens = []
            for lab, c in zip(self._group_labels(src, uuid, job), counts.tolist(), strict=True):
                if c:
                    h = self._head(len(lab) + 18 * c) + lab
                    pieces += [h, _zeros(18 * c)]
                lens.append(len(h) if c else 0)
            if len(self._layouts) * len(self.fields) >= self.max_cached:  # max_cached counts series
                self._layouts.clear()
            hit = self._layouts[key] = (pieces, np.array(lens, np.int64))
        return hit

    def _plain(self, srcs: Sequence[RowSource], groups: list[tuple[int, str, str | None]], cnt: np.ndarray,
               ts: np.ndarray, vals: np.ndarray) -> bytes:
        """The series one sample at a time, for timestamps whose varints are not 6 bytes."""
        parts = []
        i = 0
        for g, (k, u, j) in enumerate(groups):
            for lab, c in zip(self._group_labels(srcs[k], u, j), cnt[g].tolist(), strict=True):
                if c:
                    body = b"".join(wire.encode_sample(int(t), float(v)) for t, v in zip(ts[i:i + c], vals[i:i + c],
                                                                                          strict=True))
                    parts.append(self._head(len(lab) + len(body)) + lab + body)
                    i += c
        return b"".join(parts)

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
