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
from dataclasses import dataclass
from itertools import repeat

import numpy as np

from gpufleet import dcgm
from gpufleet.collector.serving_remote_write import ServingSeries
from gpufleet.protocol import AgentInfo, Batch, GpuInfo, JobInfo
from gpufleet.storage.fields import FIELD_INDEX, IS_I8, MAX, MIN, NAMES, NF
from gpufleet.storage.prepared import Prepared

from .mapping import VERSION, Conversion, Mapped, NcclSeries, RateState, SeriesMap, _memory_total
from .wire import SingleSamples

_FB_EXTRA = -1  # slot field code: dcgm.FB_FREE / FB_RESERVED (only for the memory total)
_IGNORED = -2  # not a GPU series (the reason is in Slots.reason)
_DECLINE = -3  # NCCL series: the general path
_SERVING = -4  # an inference engine's series (collector/serving_remote_write.py): handed over, no row
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
        self.fb_name = np.empty(0, dtype=bool)  # the memory total's inputs: FB extras, fb_used, fb_total
        self.mapped: list[Mapped | None] = []
        self.reason: list[str] = []
        self.serving: dict[int, ServingSeries] = {}  # slot -> the serving series it is
        self.uuids: list[str] = []
        self._uuid_code: dict[str, int] = {}
        self.nodes: list[str] = []
        self._node_code: dict[str, int] = {}
        # per uuid / node code: its name's rank among all known ones (the rows' sort order)
        self.uuid_rank = np.empty(0, dtype=np.int64)
        self.node_rank = np.empty(0, dtype=np.int64)
        self.fb_key: list[tuple[str, str] | None] = []  # per slot: (uuid, name) of a memory total input
        self._counter = np.empty(0, dtype=bool)
        self._counter_families: dict[str, bool] | None = None  # what _counter was computed for

    def counters(self, families: dict[str, bool]) -> np.ndarray:
        """Per slot: a counter whose samples become rates (``convert``'s rule: a rate field named
        *_total or whose family the metadata calls a counter). Recomputed only when a slot was
        added or the metadata changed, not per request (it was ~280 series' checks a body)."""
        if self._counter_families != families or len(self._counter) != len(self.mapped):
            out = np.zeros(len(self.mapped), dtype=bool)
            for s in np.flatnonzero(self.rate).tolist():
                m = self.mapped[s]
                assert m is not None
                out[s] = m.total_suffix or families.get(m.name, False) \
                    or families.get(m.name.removesuffix("_total"), False)
            self._counter = out
            self._counter_families = dict(families)
        return self._counter

    def ids(self, keys: list[bytes], series: SeriesMap) -> np.ndarray | None:
        """Each key's slot; None when a key is not a series the map knows (its bytes were never
        decoded as labels: the general decoder must look at them)."""
        if len(series) < self._series_len:  # the map was cleared: so are the slots
            self._reset()
        self._series_len = len(series)
        # map() with a default: the lookups run in C, ~10x cheaper than a generator per key
        ids = np.fromiter(map(self.of.get, keys, repeat(-1, len(keys))), dtype=np.int64, count=len(keys))
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
        fb: list[bool] = []
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
                is_fb = f is None or FIELD_INDEX[f.name] in _FB_FIELDS
                fb.append(is_fb)
                self.fb_key.append((m.gpu.uuid, m.name if f is None else f.name) if is_fb else None)
                self.mapped.append(m)
                self.reason.append("")
            else:
                if isinstance(m, ServingSeries):
                    self.serving[len(self.mapped)] = m
                field.append(_DECLINE if isinstance(m, NcclSeries) else _SERVING if isinstance(m, ServingSeries)
                             else _IGNORED)
                scale.append(1.0)
                gpu.append(-1)
                node.append(-1)
                rate.append(False)
                has_job.append(False)
                fb.append(False)
                self.fb_key.append(None)
                self.mapped.append(None)
                self.reason.append(m if isinstance(m, str) else "")
        self.field = np.concatenate([self.field, np.array(field, dtype=np.int64)])
        self.scale = np.concatenate([self.scale, np.array(scale, dtype=np.float64)])
        self.gpu = np.concatenate([self.gpu, np.array(gpu, dtype=np.int64)])
        self.node = np.concatenate([self.node, np.array(node, dtype=np.int64)])
        self.rate = np.concatenate([self.rate, np.array(rate, dtype=bool)])
        self.has_job = np.concatenate([self.has_job, np.array(has_job, dtype=bool)])
        self.fb_name = np.concatenate([self.fb_name, np.array(fb, dtype=bool)])
        if len(self.uuid_rank) != len(self.uuids):  # (a sort of every known name: only when one is new)
            self.uuid_rank = _ranks(self.uuids)
        if len(self.node_rank) != len(self.nodes):
            self.node_rank = _ranks(self.nodes)


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
    mapped = fcode > _IGNORED  # (_DECLINE is gone: a field, _FB_EXTRA, or ignored / serving)
    counter = slots.counters(rates.counter_families)[ids]  # series whose samples become rates
    conv = Conversion([], columnar=True)
    conv.series = conv.samples = len(ids)
    if not mapped.all():
        serving = fcode == _SERVING
        if serving.any():
            of = slots.serving
            conv.serving.extend((of[s], [(t, v)]) for s, t, v in zip(ids[serving].tolist(),
                                                                     cols.ts_ms[serving].tolist(),
                                                                     cols.values[serving].tolist(), strict=True))
            conv.ignored.update(Counter(slots.reason[s] for s in ids[~mapped & ~serving].tolist()))
        else:
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
    order = np.lexsort((kts, slots.uuid_rank[g], slots.node_rank[nd]))
    o_g, o_ts, o_nd = g[order], kts[order], nd[order]
    new_row = np.ones(len(order), dtype=bool)
    new_row[1:] = (o_g[1:] != o_g[:-1]) | (o_ts[1:] != o_ts[:-1])
    row_of = np.empty(len(order), dtype=np.int64)
    row_of[order] = np.cumsum(new_row) - 1  # per kept sample (body order): its row
    n_rows = int(new_row.sum())
    cell = row_of * NF + j[keep]
    if len(cell) and np.bincount(cell, minlength=1).max() > 1:
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
    first_ids = m_ids[np.sort(first_of_pair)]
    for s, ncode in zip(first_ids.tolist(), slots.node[first_ids].tolist(), strict=True):
        m = slots.mapped[s]
        assert m is not None
        gpus.setdefault(ncode, {}).setdefault(m.gpu.uuid, m.gpu)
    fb: dict[str, dict[str, float]] = {}
    fbi = np.flatnonzero(ok & slots.fb_name[ids] & ~bad)
    fb_key = slots.fb_key
    for s, v in zip(ids[fbi].tolist(), value[fbi].tolist(), strict=True):
        u, name = fb_key[s]  # type: ignore[misc]  # not None: fb_name[s] is set
        fb.setdefault(u, {})[name] = v
    extras = slots.node[ids[ok & (fcode == _FB_EXTRA)]]  # held as the memory total, not a row's value
    if len(extras):
        for ncode, k in zip(*np.unique(extras, return_counts=True), strict=True):
            conv.folded[slots.nodes[int(ncode)]] += int(k)
    # Rows are sorted by node first: each node's rows are one range, cut into batches of
    # max_rows. What every batch needs per row (times, GPUs, jobs, each field as the protocol's
    # list with None where missing) is built once for the whole body and sliced per batch.
    node_list = row_node.tolist()
    bounds = np.flatnonzero(np.diff(row_node)) + 1 if n_rows else row_node
    range_of = {node_list[a]: (a, b) for a, b in zip([0, *bounds.tolist()], [*bounds.tolist(), n_rows], strict=True)} \
        if n_rows else {}
    cuts: list[tuple[int, int, int, int]] = []  # (node code, ordinal, first row, end row)
    for ordinal, ncode in enumerate(sorted(gpus, key=lambda c: slots.nodes[c])):
        a, b = range_of.get(ncode, (0, 0))
        cuts.extend((ncode, ordinal, c, min(c + max_rows, b)) for c in range(a, b, max_rows))
    if not cuts:
        return conv
    missing = np.isnan(vals)
    all_missing = np.logical_and.reduceat(missing, [a for _, _, a, _ in cuts], axis=1)
    field_rows = np.flatnonzero(~all_missing.all(axis=1))
    # the rows without a field: None, as the protocol writes a missing value (set through an
    # object array in one pass: a Python loop per missing cell cost ~5% of the collector's CPU
    # on bodies cut as several shards send them, where most of a row's fields are elsewhere)
    cells = vals[field_rows].astype(object)
    cells[missing[field_rows]] = None
    columns: dict[int, list[float | int | str | None]] = dict(zip(field_rows.tolist(), cells.tolist(), strict=True))
    rows = _Rows(row_ts / 1000.0, [slots.uuids[u] for u in row_gpu.tolist()],
                 [_job(slots, s) for s in row_series.tolist()], vals, columns)
    ginfo: list[GpuInfo] = []
    last = -1
    for n, (ncode, ordinal, a, b) in enumerate(cuts):
        node = slots.nodes[ncode]
        if ncode != last:
            last = ncode
            ginfo = [GpuInfo(index=gi.index, uuid=u, model=gi.model, mig_profile=gi.mig_profile,
                             parent_uuid=gi.parent_uuid, memory_total_bytes=_memory_total(fb.get(u)))
                     for u, gi in sorted(gpus[ncode].items())]
            for gpu_info in ginfo:
                if gpu_info.index >= 0:
                    conv.gpu_updates[(cluster, node, gpu_info.index)] = gpu_info
        names = sorted(NAMES[k] for k in np.flatnonzero(~all_missing[:, n]).tolist())
        _batch(conv, rows, a, b, names, ginfo, node, cluster, digest,
               (ordinal << 20) + (a - range_of[ncode][0]) // max_rows, now)
    return conv


@dataclass(slots=True)
class _Rows:
    """The body's rows, each column whole (``_batch`` slices one batch's rows out of them)."""

    ts: np.ndarray  # seconds
    gpu: list[str]
    jobs: list[JobInfo | None]
    vals: np.ndarray  # (NF, rows), NaN = missing
    cols: dict[int, list[float | int | str | None]]  # field index -> its values, None = missing


def _batch(conv: Conversion, rows: _Rows, a: int, b: int, names: list[str], ginfo: list[GpuInfo], node: str,
           cluster: str, digest: str, seq: int, now: float) -> None:
    ts = rows.ts[a:b].copy()
    gpu = rows.gpu[a:b]
    jobs = rows.jobs[a:b]
    job_col = [j.job_id if j is not None else None for j in jobs]
    samples: dict[str, list[float | int | str | None]] = {"ts": ts.tolist(), "gpu": list(gpu)}
    if any(j is not None for j in job_col):
        samples["job"] = list(job_col)
    for name in names:
        samples[name] = rows.cols[FIELD_INDEX[name]][a:b]
    by_id = {j.job_id: j for j in jobs if j is not None}
    batch = Batch(agent=AgentInfo(boot_id=f"rw-{digest}", seq=seq, node=node, cluster=cluster, version=VERSION,
                                  sent_at=now), gpus=ginfo, jobs=list(by_id.values()), samples=samples)
    conv.batches.append(batch)
    conv.prepared.append(Prepared(batch, ts, gpu, job_col, np.ascontiguousarray(rows.vals[:, a:b]), tuple(names)))


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


def _ranks(names: list[str]) -> np.ndarray:
    """Per code (index into ``names``): its name's rank in name order."""
    rank = np.empty(len(names), dtype=np.int64)
    rank[sorted(range(len(names)), key=names.__getitem__)] = np.arange(len(names))
    return rank
