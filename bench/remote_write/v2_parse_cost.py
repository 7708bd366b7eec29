#!/usr/bin/env python
"""The receiver's CPU per body for remote write 2.0 against 1.0, on the same samples: the bench's
own bodies (bench/remote_write/run.py: ~2,000 dcgm-exporter series x 1 sample each), and each
of them re-encoded as an io.prometheus.write.v2.Request (symbols interned per body, as a 2.0
sender interns them, every series typed). ``Receiver._parse`` (snappy, digest, decode, conversion, checks) over the
bodies in send order on a warm series cache, CPU time per body, passes alternating 1.0 / 2.0,
the median of --repeat each. Both take the columnar path (2.0 read by _decode_c.scan_v2 into
1.0's columns, its keys 1.0's label bytes); --python times 2.0 through wire_v2's Python decoder
and the general conversion instead (where no C compiler built the pass). No VictoriaMetrics
figure: the 1.79 here speaks no 2.0.

Run:  .venv/bin/python bench/remote_write/v2_parse_cost.py [--nodes 100] [--windows 8] [--repeat 5] [--python]
"""

from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace

# isort: off
import gpufleet.collector.remote_write.receiver  # noqa: F401  (this tree first, as receive_micro does)
import run as rw_bench  # bench/remote_write/run.py (this directory is on sys.path when run as a script)
from receive_micro import bodies
# isort: on

from gpufleet.collector.remote_write import wire
from gpufleet.collector.remote_write.receiver import Receiver
from gpufleet.pod_jobs import DEFAULT_PATTERNS

LIMIT = 64 << 20
GAUGE = 2  # io.prometheus.write.v2 Metadata.MetricType.METRIC_TYPE_GAUGE


def _varint(out: bytearray, v: int) -> None:
    if v < 0:
        v += 1 << 64
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


def _field(out: bytearray, tag: int, data: bytes) -> None:
    out.append(tag)
    _varint(out, len(data))
    out += data


def as_v2(v1_body: bytes) -> bytes:
    """A snappy 1.0 body's series and samples as a snappy 2.0 body (metadata types by family)."""
    req = wire.decode(wire.unsnappy(v1_body, max_size=LIMIT))
    symbols: dict[str, int] = {"": 0}
    series = bytearray()
    for s in req.series:
        labels = wire.labels_of(s.key)
        refs = bytearray()
        for name, value in sorted(labels.items()):
            for sym in (name, value):
                _varint(refs, symbols.setdefault(sym, len(symbols)))
        ts = bytearray()
        _field(ts, 0x0A, bytes(refs))
        for t, v in s.samples:
            sample = bytearray(b"\x09") + wire._DOUBLE.pack(v) + b"\x10"
            _varint(sample, t)
            _field(ts, 0x12, bytes(sample))
        # every series typed, as Prometheus sends 2.0 with metadata WAL records on (the bench's
        # dcgm-exporter fields are gauges)
        kind = req.metadata.get(labels.get("__name__", ""), GAUGE)
        if kind:
            meta = bytearray(b"\x08")
            _varint(meta, kind)
            _field(ts, 0x2A, bytes(meta))
        _field(series, 0x2A, bytes(ts))
    out = bytearray()
    for sym in symbols:
        _field(out, 0x22, sym.encode())
    return wire.snappy(bytes(out + series))


def _receiver() -> Receiver:
    coll = SimpleNamespace(config=SimpleNamespace(max_age_s=30 * 86400.0, max_future_s=300.0,
                                                  kubernetes_job_patterns=DEFAULT_PATTERNS),
                           settings=SimpleNamespace(http=SimpleNamespace(max_rows_per_batch=20_000)))
    return Receiver(coll)


def one_pass(todo: list[bytes], warm: list[bytes], v2: bool) -> float:
    rec = _receiver()
    for b in warm:  # the series cache and the counters' previous samples, as a running shard has
        c = rec._parse(b, "bench", LIMIT, v2)
        assert not isinstance(c, tuple), c
        rec.rates.commit(c.rate_updates)
    t = time.process_time()
    for b in todo:
        c = rec._parse(b, "bench", LIMIT, v2)
        assert not isinstance(c, tuple), c
        rec.rates.commit(c.rate_updates)
    return (time.process_time() - t) / len(todo)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--python", action="store_true", help="2.0 through the Python decoder (no C pass)")
    args = ap.parse_args()
    v1 = bodies(args.nodes, args.windows, time.time())
    v2 = [as_v2(b) for b in v1]
    per_scrape = -(-args.nodes * 8 * len(rw_bench.DCGM_FIELDS) // rw_bench.SAMPLES_PER_SEND)
    n = 2 * per_scrape
    if len(v1) <= n:  # the first two scrapes only warm the cache: nothing would be measured
        ap.error(f"--nodes {args.nodes} --windows {args.windows} give {len(v1)} bodies, all of them the "
                 f"{n} that warm the series cache: raise --windows")
    # the same rows either way: the first body of each converted by a fresh receiver
    first = [_receiver()._parse(body, "bench", LIMIT, ver) for body, ver in ((v1[0], False), (v2[0], True))]
    assert not any(isinstance(c, tuple) for c in first), first
    assert [x.samples for x in first[0].batches] == [x.samples for x in first[1].batches]  # type: ignore[union-attr]
    times: dict[str, list[float]] = {"1.0": [], "2.0": []}
    for _ in range(args.repeat):
        times["1.0"].append(one_pass(v1[n:], v1[:n], False))
        native, wire._NATIVE = wire._NATIVE, None if args.python else wire._NATIVE
        try:
            times["2.0"].append(one_pass(v2[n:], v2[:n], True))
        finally:
            wire._NATIVE = native
    raw1 = sum(len(x) for x in v1) / len(v1)
    raw2 = sum(len(x) for x in v2) / len(v2)
    print(f"{len(v1) - n} bodies of {rw_bench.SAMPLES_PER_SEND} samples; snappy bytes per body: 1.0 {raw1:,.0f}, "
          f"2.0 {raw2:,.0f} ({raw2 / raw1:.2f}x)")
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in times.items():
        print(f"  {k}: {med[k] * 1e3:.3f} ms CPU per body (median of {len(v)}; min {min(v) * 1e3:.3f})")
    print(f"  2.0 / 1.0 CPU per body: {med['2.0'] / med['1.0']:.2f}x")


if __name__ == "__main__":
    main()
