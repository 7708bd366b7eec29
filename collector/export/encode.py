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
from types import ModuleType

import numpy as np

from gpufleet.catalog import CATALOG
from gpufleet.collector.remote_write import wire

LABELS = ("cluster", "node", "gpu", "uuid", "job", "user")
PREFIX = "gpufleet_"
_NAMES = CATALOG.names
_LO, _HI = 1 << 35, 1 << 42  # ms timestamps whose varint is exactly 6 bytes


def _load_native() -> ModuleType | None:
    """The optional C pass (_encode_c.c, built by setup.py where a C compiler is): it writes a
    body straight from the stored arrays, where the numpy path below makes ~15 array passes per
    sample; None where it was not built (the numpy path then encodes the same bytes)."""
    try:
        from . import _encode_c
    except ImportError:
        return None
    return _encode_c


_NATIVE = _load_native()


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


# One Sample field with its tags and lengths in place and a zero value and timestamp: bytes 0-2
# the field tag, length 16 and the value's tag, 3-10 the double, 11 the timestamp's tag, 12-17
# its 6-byte varint.
_BLANK = b"\x12\x10\x09" + bytes(8) + b"\x10" + bytes(6)


@functools.lru_cache(maxsize=1024)
def _blanks(c: int) -> bytes:
    """The hole a series' ``c`` samples are written into, their constant bytes already there
    (shared by every layout of that size): the encoder writes only values and timestamps."""
    return _BLANK * c


def samples_array(ts_ms: np.ndarray, values: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray | None:
    """The encoded Sample fields (tag, length, message) of aligned int64 ms / float64 arrays as
    18-byte records, or None when a timestamp's varint is not 6 bytes (before 1971, after 2109).
    With ``rows``, ``ts_ms`` holds one timestamp per row and sample i has timestamp
    ts_ms[rows[i]] (a batch has far fewer rows than samples: the varints are computed per row)."""
    n = len(values)
    if not n or int(ts_ms.min()) < _LO or int(ts_ms.max()) >= _HI:
        return None
    buf = np.empty(n, _SAMPLE)
    buf["head"] = _HEAD
    v = np.ascontiguousarray(values, dtype="<f8")
    buf["value"] = v
    tv = _ts_varints(ts_ms)
    buf["tail"] = (v.view("<u8") >> np.uint64(56)) | np.uint64(0x10 << 8) | (
        (tv if rows is None else tv[rows]) << np.uint64(16))
    return buf


def samples_bytes(ts_ms: np.ndarray, values: np.ndarray, rows: np.ndarray | None = None) -> bytes:
    """``samples_array``'s bytes, or (odd timestamps) the samples encoded one by one."""
    buf = samples_array(ts_ms, values, rows)
    if buf is not None:
        return buf.tobytes()
    tsv = ts_ms if rows is None else ts_ms[rows]
    return b"".join(wire.encode_sample(int(t), float(v)) for t, v in zip(tsv, values, strict=True))


def _records(out: bytearray, size: int) -> np.ndarray:
    """``out`` as a ``size``-byte record starting at every byte offset (overlapping, stride 1):
    a value is then scattered to any offset as one item, a single copy, instead of as ``size``
    single bytes each with its own int64 index (that was 60% of the encoder's CPU)."""
    return np.ndarray(shape=(max(0, len(out) - size + 1),), dtype=f"V{size}", buffer=out, strides=(1,))


def _group_ids(k: int, x: RowSource, groups: list[tuple[int, str, str | None]]) -> np.ndarray:
    """Each row's (GPU, job) group id, the new groups appended to ``groups`` as (k, GPU, job) in
    order of appearance, at C speed: by GPU alone when the source has one job (a batch's usual
    case: no tuple per row), by (GPU, job) pairs otherwise."""
    jobs = dict.fromkeys(x.job)
    if len(jobs) == 1:
        (job,) = jobs
        by_gpu = dict.fromkeys(x.gpu, 0)
        for u in by_gpu:  # a source's GPUs in order of appearance: few
            by_gpu[u] = len(groups)
            groups.append((k, u, job))
        return np.fromiter(map(by_gpu.__getitem__, x.gpu), np.int64, len(x.ts))
    pairs = dict.fromkeys(zip(x.gpu, x.job, strict=True), 0)
    for u, j in pairs:
        pairs[u, j] = len(groups)
        groups.append((k, u, j))
    return np.fromiter(map(pairs.__getitem__, zip(x.gpu, x.job, strict=True)), np.int64, len(x.ts))


class Encoder:
    def __init__(self, fields: Iterable[str] | None = None, labels: Iterable[str] = LABELS,
                 max_cached: int = 100_000, native: bool = True) -> None:
        names = list(fields) if fields is not None else list(_NAMES)
        unknown = [f for f in names if f not in CATALOG]
        if unknown:
            raise ValueError(f"export fields {unknown} are not catalog fields (see gpufleet/catalog.toml)")
        bad = [x for x in labels if x not in LABELS]
        if bad:
            raise ValueError(f"export labels {bad} not among {', '.join(LABELS)}")
        self.fields = [(_NAMES.index(f), f) for f in names]
        self.labels = tuple(labels)
        self._name_labels = [wire.encode_labels([("__name__", PREFIX + f)]) for _, f in self.fields]
        self._cache: dict[tuple[str, str, str, str | None], list[bytes]] = {}
        self._layouts: dict[tuple[str, str, str, str | None, bytes], tuple[list[bytes], bytes]] = {}
        self._rows = [j for j, _ in self.fields]
        self._all_fields = self._rows == list(range(len(_NAMES)))  # no row selection to copy
        self._rows_i64 = np.array(self._rows, np.int64)
        self.max_cached = max_cached
        # native=False: the numpy path even where the C pass is built (the tests' reference)
        self.native = native and _NATIVE is not None

    def _gpu_labels(self, src: RowSource, uuid: str, job: str | None) -> bytes:
        """A GPU's labels but the metric name, encoded once for all its fields' series."""
        have = {"cluster": src.cluster, "node": src.node, "uuid": uuid,
                "gpu": str(src.gpu_index[uuid]) if uuid in src.gpu_index else "",
                "job": job or "", "user": (src.job_user.get(job) or "") if job else ""}
        return wire.encode_labels([(k, have[k]) for k in self.labels if have[k]])

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
        gid = np.concatenate([_group_ids(k, x, groups) for k, x in enumerate(srcs)])
        ts_all = np.concatenate([np.asarray(x.ts, dtype=np.float64) for x in srcs])
        order = np.lexsort((ts_all, gid))  # by series, then time: receivers want a series' samples in order
        ts_ms = np.rint(ts_all[order] * 1000.0).astype(np.int64)
        every = np.concatenate([x.vals for x in srcs], axis=1) if len(srcs) > 1 else srcs[0].vals
        ng = len(groups)
        bounds = np.searchsorted(gid[order], np.arange(ng + 1))  # each GPU's rows
        if self.native:  # the same bytes in one C pass: the labels per (GPU, field), the rest from the arrays
            every = np.ascontiguousarray(every, np.float64)
            labels = [self._group_labels(srcs[k], u, j) for k, u, j in groups]
            native = _NATIVE
            assert native is not None  # self.native is True only where the C pass imported
            body, count = native.encode(every, every.shape[1], self._rows_i64, order, bounds, ts_ms, labels)
            return body, count
        vals = (every if self._all_fields else every[self._rows])[:, order]  # (exported fields, n)
        nf, n = vals.shape
        # each sample's row (cols) and index into vals.ravel(), in (GPU, field, time) order:
        # one run per (GPU, field)
        run = np.repeat(np.diff(bounds), nf)
        first = np.cumsum(run) - run
        cols = np.repeat(np.repeat(bounds[:-1], nf) - first, run) + np.arange(nf * n)
        idx = cols + np.repeat(np.tile(np.arange(0, nf * n, n), ng), run)
        flat = vals.ravel()[idx]
        ok = ~np.isnan(flat)  # NaN (not available) is never exported
        counts = run
        if not ok.all():
            counts = np.add.reduceat(ok, first, dtype=np.int64) if len(ok) else run
            cols, flat = cols[ok], flat[ok]
        if not len(flat):
            return b"", 0
        cnt = counts.reshape(ng, nf)
        if int(ts_ms.min()) < _LO or int(ts_ms.max()) >= _HI:  # odd timestamps (before 1971, after 2109)
            return self._plain(srcs, groups, cnt, ts_ms[cols], flat), len(flat)
        parts: list[bytes] = []
        lens: list[bytes] = []
        layouts = self._layouts
        cnt_b, w = cnt.tobytes(), 8 * nf
        for g, (k, u, j) in enumerate(groups):  # a few Python steps per GPU, none per series
            x = srcs[k]
            key = (x.cluster, x.node, u, j, cnt_b[g * w:(g + 1) * w])
            hit = layouts.get(key) or self._layout(key, x, cnt[g])
            parts += hit[0]
            lens.append(hit[1])
        out = bytearray().join(parts)
        head_len = np.frombuffer(b"".join(lens), np.int64)
        size = head_len + 18 * counts
        region = np.cumsum(size) - size + head_len  # where each series' samples go
        firsts = np.cumsum(counts) - counts
        at = np.repeat(region - 18 * firsts, counts) + 18 * np.arange(len(flat))  # each sample's offset
        # The holes hold the tags already: write each double, and each row's timestamp varint
        # (computed per row, gathered per sample), as one record scatter each.
        _records(out, 8)[at + 3] = np.ascontiguousarray(flat, "<f8").view("V8")
        tv = np.ascontiguousarray(_ts_varints(ts_ms), "<u8").view(np.uint8).reshape(-1, 8)[:, :6]
        _records(out, 6)[at + 12] = np.ascontiguousarray(tv).view("V6").ravel()[cols]
        return bytes(out), len(flat)

    def _layout(self, key: tuple[str, str, str, str | None, bytes], src: RowSource,
                counts: np.ndarray) -> tuple[list[bytes], bytes]:
        """A GPU's series with ``counts`` samples per field: [head + labels, blank samples]
        per present field, and each field's head + labels length (0 when absent) as int64 bytes."""
        pieces: list[bytes] = []
        lens = []
        for lab, c in zip(self._group_labels(src, key[2], key[3]), counts.tolist(), strict=True):
            if c:
                h = self._head(len(lab) + 18 * c) + lab
                pieces += [h, _blanks(c)]
            lens.append(len(h) if c else 0)
        if len(self._layouts) * len(self.fields) >= self.max_cached:  # max_cached counts series
            self._layouts.clear()
        hit = self._layouts[key] = (pieces, np.array(lens, np.int64).tobytes())
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
            # labels are sorted by name on the wire and "__name__" sorts before every one of
            # LABELS (all lower case): a series' labels are its name's label, then the GPU's
            # (one encode_labels per GPU, not per series: ~5 us each, 96,000 of them on a
            # fresh collector of the bench's 3,200 GPUs)
            rest = self._gpu_labels(src, uuid, job)
            hit = [name + rest for name in self._name_labels]
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
