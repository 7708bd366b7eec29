"""``mapping.convert`` for a Prometheus shard's steady state, over the whole body with numpy.

A steady-state body is ~2,000 series seen before, one sample each. Per series, the general
path costs a Series object, a dict lookup and a dozen Python operations per sample; here each
known series has a slot (its catalog field, scale, GPU, node and job as array entries, built
once), the samples are arrays (``wire.scan_single_samples``), the checks (NaN, age, range,
integer fields) are array operations and the rows per (GPU, timestamp) come from one lexsort,
so Python works per row (~36 per 1,000 series) rather than per sample.

It answers exactly what ``convert`` answers (tests/prometheus/test_columnar.py compares them)
and declines (returns None, the caller runs ``convert``) whatever it does not cover: series not
seen before, a series with several samples or histograms, NCCL series, a field given twice for
one row (old and new DCGM names: the general path keeps the last), metadata in the body.
Counters become rates in a Python loop over just their samples, in body order (the same
previous-sample rule as ``convert``).
"""

from __future__ import annotations

from collections import Counter
from itertools import repeat

import numpy as np

from gpufleet import dcgm
from gpufleet.protocol import AgentInfo, Batch, GpuInfo, JobInfo
from gpufleet.storage.fields import FIELD_INDEX, IS_I8, MAX, MIN, NAMES, NF
from gpufleet.storage.prepared import Prepared

from .mapping import VERSION, Conversion, Mapped, NcclSeries, RateState, SeriesMap, _memory_total
from .wire import SingleSamples

_FB_EXTRA = -1  # slot field code: dcgm.FB_FREE / FB_RESERVED (only for the memory total)
_IGNORED = -2  # not a GPU series (the reason is in Slots.reason)
_DECLINE = -3  # NCCL series: the general path
_FB_FIELDS = {FIELD_INDEX.get("fb_used_bytes", -9), FIELD_INDEX.get("fb_total_bytes", -9)}


class Slots:
    """Known series -> array rows (per process, beside the SeriesMap; rebuilt when it clears)."""

    def __init__(self) -> None:
        self._reset()
        self._series_len = -1

    def _reset(self) -> None:
        self.of: dict[bytes, int] = {}
        self.field = np.empty(0, dtype=np.int64)
        self.scale = np.empty(0)
        self.gpu = np.empty(0, dtype=np.int64)
        self.node = np.empty(0, dtype=np.int64)
        self.rate = np.empty(0, dtype=bool)
        self.has_job = np.empty(0, dtype=bool)
        self.mapped: list[Mapped | None] = []
        self.reason: list[str] = []
        self.uuids: list[str] = []
        self._uuid_code: dict[str, int] = {}
        self.nodes: list[str] = []
        self._node_code: dict[str, int] = {}

    def ids(self, keys: list[bytes], series: SeriesMap) -> np.ndarray | None:
        """Each key's slot; None when a key is not a series the map knows (its bytes were never
        decoded as labels: the general decoder must look at them)."""
        if len(series) < self._series_len:  # the map was cleared: so are the slots
            self._reset()
        self._series_len = len(series)
        # map() with a default: the lookups run in C, ~10x cheaper than a generator per key
        ids = np.array(list(map(self.of.get, keys, repeat(-1, len(keys)))), dtype=np.int64)
        missing = np.flatnonzero(ids < 0)
        if len(missing):
            known = series.known
            new = list(dict.fromkeys(keys[i] for i in missing.tolist()))
            if not all(map(known.__contains__, new)):
                return None
            self._add(new, series)
            ids[missing] = [self.of[keys[i]] for i in missing.tolist()]
        return ids

    def _code(self, table: list[str], codes: dict[str, int], s: str) -> int:
        c = codes.get(s)
        if c is None:
            c = codes[s] = len(table)
            table.append(s)
        return c

    def _add(self, keys: list[bytes], series: SeriesMap) -> None:
        field: list[int] = []
        scale: list[float] = []
        gpu: list[int] = []
        node: list[int] = []
        rate: list[bool] = []
        has_job: list[bool] = []
        for k in keys:
            m = series.get(k)
            self.of[k] = len(self.mapped)
            if isinstance(m, Mapped):
                f = m.field
                field.append(FIELD_INDEX[f.name] if f is not None else _FB_EXTRA)
                scale.append(f.dcgm_scale if f is not None else dcgm.MIB)
                gpu.append(self._code(self.uuids, self._uuid_code, m.gpu.uuid))
                node.append(self._code(self.nodes, self._node_code, m.node))
                rate.append(m.rate_field)
                has_job.append(m.job is not None)
                self.mapped.append(m)
                self.reason.append("")
            else:
                field.append(_DECLINE if isinstance(m, NcclSeries) else _IGNORED)
                scale.append(1.0)
                gpu.append(-1)
                node.append(-1)
                rate.append(False)
                has_job.append(False)
                self.mapped.append(None)
                self.reason.append(m if isinstance(m, str) else "")
        self.field = np.concatenate([self.field, np.array(field, dtype=np.int64)])
        self.scale = np.concatenate([self.scale, np.array(scale, dtype=np.float64)])
        self.gpu = np.concatenate([self.gpu, np.array(gpu, dtype=np.int64)])
        self.node = np.concatenate([self.node, np.array(node, dtype=np.int64)])
        self.rate = np.concatenate([self.rate, np.array(rate, dtype=bool)])
        self.has_job = np.concatenate([self.has_job, np.array(has_job, dtype=bool)])


def convert_columnar(cols: SingleSamples, series: SeriesMap, slots: Slots, rates: RateState, *, cluster: str,
                     digest: str, now: float, max_age_s: float | None, max_future_s: float,
                     max_rows: int) -> Conversion | None:
    """``convert``'s answer for ``cols`` (batches and their ``prepared`` arrays), or None where
    it declines (see the module doc). Changes nothing but the caches when it declines."""
    found = slots.ids(cols.keys, series)
    if found is None:
        return None
    ids = found
    fcode = slots.field[ids]
    if (fcode == _DECLINE).any():
        return None
    mapped = fcode != _IGNORED
    counter = np.zeros(len(ids), dtype=bool)  # series whose samples become rates
    if slots.rate[ids].any():
        fam = rates.counter_families
        counters = []
        for s in np.unique(ids[slots.rate[ids]]).tolist():
            m = slots.mapped[s]
            assert m is not None
            if m.total_suffix or fam.get(m.name, False) or fam.get(m.name.removesuffix("_total"), False):
                counters.append(s)
        if counters:
            counter = np.isin(ids, counters)
    conv = Conversion([], columnar=True)
    conv.series = conv.samples = len(ids)
    if not mapped.all():
        conv.ignored.update(Counter(slots.reason[s] for s in ids[~mapped].tolist()))
    lo = -np.inf if max_age_s is None else (now - max_age_s) * 1000.0
    hi = (now + max_future_s) * 1000.0
    ts, raw = cols.ts_ms, cols.values
    nan = mapped & np.isnan(raw)
    old = mapped & ~nan & (ts < lo)
    future = mapped & ~nan & ~old & (ts > hi)
    ok = mapped & ~nan & ~old & ~future
    with np.errstate(invalid="ignore", over="ignore"):  # NaN (staleness) and huge values: masked
        value = raw * slots.scale[ids]
    no_rate = _rates(conv, np.flatnonzero(ok & counter), ids, slots, rates, cluster, ts, raw, value) \
        if counter.any() else counter
    is_field = ok & (fcode >= 0) & ~no_rate
    j = np.where(is_field, fcode, 0)
    with np.errstate(invalid="ignore"):
        bad = is_field & ((value < MIN[j]) | (value > MAX[j]) | (IS_I8[j] & (value != np.floor(value))))
    keep = np.flatnonzero(is_field & ~bad)
    for reason, mask in (("nan_or_stale", nan), ("too_old", old), ("in_future", future),
                         ("outside_catalog_range", bad)):
        if (c := int(np.count_nonzero(mask))):
            conv.dropped[reason] = c
    conv.stored_values = len(keep)
    # rows: one per (node, GPU, ts), in the general path's order (nodes by name, then uuid, ts)
    g = slots.gpu[ids[keep]]
    nd = slots.node[ids[keep]]
    kts = ts[keep]
    order = np.lexsort((kts, _rank(g, slots.uuids), _rank(nd, slots.nodes)))
    o_g, o_ts, o_nd = g[order], kts[order], nd[order]
    new_row = np.ones(len(order), dtype=bool)
    new_row[1:] = (o_g[1:] != o_g[:-1]) | (o_ts[1:] != o_ts[:-1])
    row_of = np.empty(len(order), dtype=np.int64)
    row_of[order] = np.cumsum(new_row) - 1  # per kept sample (body order): its row
    n_rows = int(new_row.sum())
    cell = row_of * NF + j[keep]
    if len(np.unique(cell)) != len(cell):
        return None  # a field twice for one row (old and new DCGM names): last-wins, general path
    vals = np.full((NF, n_rows), np.nan)
    vals[j[keep], row_of] = value[keep]
    row_ts = o_ts[new_row]
    row_gpu = o_g[new_row]
    row_node = o_nd[new_row]
    # per row, the job of its first stored series that names one (body order), else None
    kept_ids = ids[keep]
    with_job = slots.has_job[kept_ids]
    first = np.full(n_rows, len(keep), dtype=np.int64)
    np.minimum.at(first, row_of[with_job], np.flatnonzero(with_job))
    row_series = np.where(first < len(keep), kept_ids[np.minimum(first, max(len(keep) - 1, 0))], -1) \
        if n_rows else first
    # per node: its GPUs (first identity seen, from every mapped series, stored or not) and the
    # framebuffer values of the memory total (last seen in body order)
    m_ids = ids[mapped]
    pair = slots.node[m_ids] * max(len(slots.uuids), 1) + slots.gpu[m_ids]
    _, first_of_pair = np.unique(pair, return_index=True)
    gpus: dict[int, dict[str, dcgm.GpuIdentity]] = {}
    for s in m_ids[np.sort(first_of_pair)].tolist():
        m = slots.mapped[s]
        assert m is not None
        gpus.setdefault(slots.node[s].item(), {}).setdefault(m.gpu.uuid, m.gpu)
    fb: dict[str, dict[str, float]] = {}
    fbi = np.flatnonzero(ok & ((fcode == _FB_EXTRA) | np.isin(fcode, list(_FB_FIELDS)) & ~bad))
    for i in fbi.tolist():
        m = slots.mapped[ids[i]]
        assert m is not None
        fb.setdefault(m.gpu.uuid, {})[m.name if m.field is None else m.field.name] = float(value[i])
    node_of_rows: dict[int, list[int]] = {}
    for r, n in enumerate(row_node.tolist()):
        node_of_rows.setdefault(n, []).append(r)
    for ordinal, ncode in enumerate(sorted(gpus, key=lambda c: slots.nodes[c])):
        rows = node_of_rows.get(ncode)
        if not rows:
            continue
        node = slots.nodes[ncode]
        ginfo = [GpuInfo(index=gi.index, uuid=u, model=gi.model, mig_profile=gi.mig_profile,
                         parent_uuid=gi.parent_uuid, memory_total_bytes=_memory_total(fb.get(u)))
                 for u, gi in sorted(gpus[ncode].items())]
        for gpu_info in ginfo:
            if gpu_info.index >= 0:
                conv.gpu_updates[(cluster, node, gpu_info.index)] = gpu_info
        for c in range(0, len(rows), max_rows):
            chunk = np.array(rows[c:c + max_rows], dtype=np.int64)
            _batch(conv, chunk, ginfo, slots, row_ts, row_gpu, row_series, vals, node, cluster, digest,
                   (ordinal << 20) + c // max_rows, now)
    return conv


def _batch(conv: Conversion, chunk: np.ndarray, ginfo: list[GpuInfo], slots: Slots, row_ts: np.ndarray,
           row_gpu: np.ndarray, row_series: np.ndarray, vals: np.ndarray, node: str, cluster: str, digest: str,
           seq: int, now: float) -> None:
    cv = vals[:, chunk]
    present = np.flatnonzero(~np.isnan(cv).all(axis=1))
    ts = row_ts[chunk] / 1000.0
    gpu = [slots.uuids[u] for u in row_gpu[chunk].tolist()]
    jobs: list[JobInfo | None] = [_job(slots, s) for s in row_series[chunk].tolist()]
    job_col = [j.job_id if j is not None else None for j in jobs]
    samples: dict[str, list[float | int | str | None]] = {"ts": ts.tolist(), "gpu": list(gpu)}
    if any(j is not None for j in job_col):
        samples["job"] = list(job_col)
    names = sorted(NAMES[k] for k in present.tolist())
    for name in names:
        samples[name] = [None if v != v else v for v in cv[FIELD_INDEX[name]].tolist()]
    by_id = {j.job_id: j for j in jobs if j is not None}
    batch = Batch(agent=AgentInfo(boot_id=f"rw-{digest}", seq=seq, node=node, cluster=cluster, version=VERSION,
                                  sent_at=now), gpus=ginfo, jobs=list(by_id.values()), samples=samples)
    conv.batches.append(batch)
    conv.prepared.append(Prepared(batch, ts, gpu, job_col, cv.copy(), tuple(names)))


def _rates(conv: Conversion, idx: np.ndarray, ids: np.ndarray, slots: Slots, rates: RateState, cluster: str,
           ts: np.ndarray, raw: np.ndarray, value: np.ndarray) -> np.ndarray:
    """Counter samples ``idx`` (body order) -> rates in ``value``, as ``convert`` computes them
    (the previous sample from this request or an earlier one); returns the samples that have no
    rate (a first sample, a reset), counted in ``conv.dropped``."""
    none = np.zeros(len(ids), dtype=bool)
    pending = conv.rate_updates
    last = rates.last
    first = reset = 0
    for i in idx.tolist():
        m = slots.mapped[ids[i]]
        assert m is not None and m.field is not None
        k = (cluster, m.gpu.uuid, m.field.name)
        t = ts[i].item() / 1000.0
        v = raw[i].item()
        prev = pending.get(k) or last.get(k)
        pending[k] = (t, v)
        if prev is None or t <= prev[0]:
            first += 1
            none[i] = True
        elif v < prev[1]:
            reset += 1
            none[i] = True
        else:
            value[i] = (v - prev[1]) / (t - prev[0]) * m.field.dcgm_scale
    if first:
        conv.dropped["counter_first_sample"] = first
    if reset:
        conv.dropped["counter_reset"] = reset
    return none


def _job(slots: Slots, s: int) -> JobInfo | None:
    m = slots.mapped[s] if s >= 0 else None
    return m.job if m is not None else None


def _rank(codes: np.ndarray, names: list[str]) -> np.ndarray:
    """Per entry of ``codes`` (indices into ``names``): its name's rank among the names used."""
    if not len(codes):
        return codes
    used = np.unique(codes).tolist()
    rank = np.zeros(len(names), dtype=np.int64)
    rank[sorted(used, key=names.__getitem__)] = np.arange(len(used))
    out: np.ndarray = rank[codes]
    return out
