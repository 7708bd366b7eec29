"""The columnar conversion (collector/remote_write/columnar.py) answers exactly what the general
``mapping.convert`` answers, on the real dcgm-exporter captures with the awkward cases mixed in
(NaN, stale markers, values outside the catalog, too old, GPUs on several nodes, batches split by
max_rows), and declines what it does not cover."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from gpufleet.collector.columns import prepare
from gpufleet.collector.remote_write import wire
from gpufleet.collector.remote_write.columnar import Slots, convert_columnar
from gpufleet.collector.remote_write.mapping import RateState, SeriesMap, convert
from tests.prometheus.captures import DUMPS, body, capture_series

NOW = time.time()
T0 = int(NOW * 1000) - 60_000
STALE = float.fromhex("0x7ff0000000000002")  # Prometheus' staleness marker, a NaN


def _series(t0: int, bad: bool) -> list[tuple[dict[str, str], list[tuple[int, float]]]]:
    out = []
    for d, name in enumerate(DUMPS):
        for k, (lab, v, _) in enumerate(capture_series(name, instance=f"{name[:6]}:9400")):
            lab = dict(lab)
            if d == 2 and k % 2:
                lab["Hostname"] = "second-node"  # some of a capture's series name another node
            value = v
            if bad and k % 7 == 0:
                value = STALE if k % 2 else math.nan
            elif bad and k % 11 == 0:
                value = -1e9  # outside every field's range
            out.append((lab, [(t0 - (3_600_000 if bad and k % 5 == 3 else 0), value)]))
            if lab["__name__"] == "DCGM_FI_DEV_GPU_TEMP" and "UUID" in lab:  # a counter beside it
                # (the captures' own PCIe counters carry no GPU labels); bad: it resets every other scrape
                total = 1e3 if bad and (t0 // 15_000) % 2 else t0 * 2_000.0
                out.append(({**lab, "__name__": "DCGM_FI_PROF_PCIE_TX_BYTES"}, [(t0, total)]))
    return out


def _known(raw: bytes, series: SeriesMap) -> None:
    for s in wire.decode(raw).series:
        series.get(s.key)


@pytest.mark.parametrize("bad", [False, True])
@pytest.mark.parametrize("max_rows", [20_000, 2])
def test_columnar_answers_what_convert_answers(bad: bool, max_rows: int) -> None:
    smap = SeriesMap()
    fast_rates, slow_rates = RateState(), RateState()
    for r in (fast_rates, slow_rates):  # dcgm-exporter's metadata (sent apart) names its counters
        r.counter_families.update({"DCGM_FI_PROF_PCIE_TX_BYTES": True, "DCGM_FI_PROF_PCIE_RX_BYTES": True})
    slots = Slots()
    kw = dict(cluster="c", digest="d", now=NOW, max_age_s=600.0, max_future_s=300, max_rows=max_rows)
    counted = resets = 0
    for send in range(2):  # the second send's counters have their previous sample in the first's
        series: list[tuple[dict[str, str], list[tuple[int, float]]]] = []
        for w in range(3):  # three scrapes in one body: several rows per GPU
            series += _series(T0 + (3 * send + w) * 15_000, bad)
        raw = body(series)
        _known(raw, smap)
        cols = wire.scan_single_samples(raw, None)
        assert cols is not None and len(cols.keys) == len(series)
        fast = convert_columnar(cols, smap, slots, fast_rates, **kw)  # type: ignore[arg-type]
        slow = convert(wire.decode(raw, smap.known), smap, slow_rates, **kw)  # type: ignore[arg-type]
        assert fast is not None
        assert fast.columnar and not slow.columnar
        assert slow.batches and fast.summary() == dict(slow.summary(), columnar=True)
        assert fast.rate_updates == slow.rate_updates and fast.rate_updates
        if bad:
            assert {"nan_or_stale", "too_old", "outside_catalog_range"} <= set(fast.dropped)
        counted += fast.dropped.get("counter_first_sample", 0)
        resets += fast.dropped.get("counter_reset", 0)
        assert fast.gpu_updates == slow.gpu_updates
        assert len(fast.batches) == len(slow.batches) == len(fast.prepared)
        for fb, sb, fp in zip(fast.batches, slow.batches, fast.prepared, strict=True):
            assert fb == sb
            ref = prepare(sb)
            assert fp.gpu == ref.gpu and fp.job == ref.job and fp.columns == ref.columns
            np.testing.assert_array_equal(fp.ts, ref.ts)
            np.testing.assert_array_equal(fp.vals, ref.vals)
        fast_rates.commit(fast.rate_updates)
        slow_rates.commit(slow.rate_updates)
    assert counted > 0  # the counters were really turned into rates (first samples have none)
    if bad:
        assert resets > 0
    else:
        assert any("pcie_tx_bytes_s" in b.samples for b in fast.batches)


def test_columnar_declines_what_it_does_not_cover() -> None:
    lab = next(lab for lab, _, _ in capture_series(DUMPS[0])
               if lab["__name__"] == "DCGM_FI_DEV_GPU_TEMP" and "UUID" in lab)
    one = body([(lab, [(T0, 40.0)])])
    smap = SeriesMap()
    assert wire.scan_single_samples(one, smap.known) is None  # labels not seen yet
    unseen = wire.scan_single_samples(one, None)
    assert unseen is not None and convert_columnar(unseen, smap, Slots(), RateState(), cluster="c", digest="d",
                                                   now=NOW, max_age_s=None, max_future_s=300, max_rows=100) is None
    _known(one, smap)
    assert wire.scan_single_samples(one, smap.known) is not None
    assert wire.scan_single_samples(body([(lab, [(T0, 40.0), (T0 + 15_000, 41.0)])]), smap.known) is None
    assert wire.scan_single_samples(body([(lab, [(T0, 40.0)])], [("DCGM_FI_DEV_GPU_TEMP", 2)]),
                                    smap.known) is None  # metadata
    twice = {**lab, "__name__": "DCGM_FI_DEV_GPU_TEMP", "extra": "x"}  # the same field twice for one row
    raw = body([(lab, [(T0, 40.0)]), (twice, [(T0, 41.0)])])
    _known(raw, smap)
    cols = wire.scan_single_samples(raw, smap.known)
    assert cols is not None
    assert convert_columnar(cols, smap, Slots(), RateState(), cluster="c", digest="d", now=NOW, max_age_s=None,
                            max_future_s=300, max_rows=100) is None
