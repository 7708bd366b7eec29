"""Typed features of one job's collectives and fabric (pure; built by ``load.py`` from the
database or by tests from protocol objects).

A *series* is one (communicator, collective, message-size bucket): bus bandwidth is only
comparable within one (small messages are latency bound; a checkpoint's 4 GiB all-reduce runs
faster than the 256 MiB gradient buckets). Per series and time bin (``bin_s``) we keep the
count-weighted median bus bandwidth over ranks and each rank's exec time.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

SeriesKey = tuple[str, str, int]  # (comm, coll, size bucket)


@dataclass(frozen=True, slots=True)
class CollRow:
    ts: float
    node: str
    comm: str
    rank: int
    coll: str
    size_bucket: int
    count: int
    exec_us_p50: float
    busbw_gbs_p50: float | None
    gpu_uuid: str | None = None
    n_ranks: int | None = None
    n_nodes: int | None = None


@dataclass(frozen=True, slots=True)
class NicRow:
    ts: float
    node: str
    nic: str
    interval_s: float
    rate_gbps: float | None
    state: str | None
    xmit_wait: float | None  # increase over the interval (ticks); None = not available
    errors: float | None  # sum of error-counter increases; None = not available
    counters: dict[str, float] = field(default_factory=dict)


@dataclass
class FabricView:
    colls: list[CollRow]
    nics: list[NicRow]
    rails: dict[str, list[str]] = field(default_factory=dict)  # GPU uuid -> NICs ("mlx5_0/1")
    first_ts: float = 0.0
    last_ts: float = 0.0
    # GPU uuid -> how its agent mapped HCAs to it (pcie | numa | node): "node" means each GPU's
    # ib_* fields carry the whole node's traffic (catalog.toml), not its own.
    rail_modes: dict[str, str] = field(default_factory=dict)

    def empty(self) -> bool:
        return not self.colls and not self.nics


@dataclass
class Series:
    key: SeriesKey
    n_nodes: int
    bins: list[float]  # bin starts with data, sorted
    busbw: list[float]  # count-weighted median over ranks per bin (GB/s); NaN = no bandwidth reported
    calls: list[int]  # collectives per bin (all ranks)
    exec_us: list[dict[tuple[str, int], float]]  # per bin: (node, rank) -> exec time p50
    gpu_of: dict[tuple[str, int], str | None]  # (node, rank) -> GPU uuid
    lost_us: list[float]  # per bin: sum over rows of count x exec x (1 - busbw / best) (set by detect)
    rows: list[list[CollRow]] = field(repr=False, default_factory=list)


def weighted_median(pairs: list[tuple[float, int]]) -> float:
    pairs = sorted(pairs)
    total = sum(w for _, w in pairs)
    acc = 0
    for v, w in pairs:
        acc += w
        if acc * 2 >= total:
            return v
    return math.nan


def build_series(view: FabricView, bin_s: float) -> list[Series]:
    by: dict[SeriesKey, dict[float, list[CollRow]]] = defaultdict(lambda: defaultdict(list))
    nodes_of: dict[SeriesKey, set[str]] = defaultdict(set)
    n_nodes: dict[SeriesKey, int] = {}
    for r in view.colls:
        k = (r.comm, r.coll, r.size_bucket)
        by[k][math.floor(r.ts / bin_s) * bin_s].append(r)
        nodes_of[k].add(r.node)
        if r.n_nodes:
            n_nodes[k] = max(n_nodes.get(k, 0), r.n_nodes)
    out = []
    for k in sorted(by):
        bins = sorted(by[k])
        s = Series(k, n_nodes.get(k, len(nodes_of[k])), bins, [], [], [], {}, [0.0] * len(bins))
        for b in bins:
            rows = by[k][b]
            bw = [(r.busbw_gbs_p50, r.count) for r in rows if r.busbw_gbs_p50 is not None]
            s.busbw.append(weighted_median(bw) if bw else math.nan)
            s.calls.append(sum(r.count for r in rows))
            ex: dict[tuple[str, int], float] = {}
            for r in rows:
                ex[(r.node, r.rank)] = r.exec_us_p50 if (r.node, r.rank) not in ex else min(ex[(r.node, r.rank)],
                                                                                         r.exec_us_p50)
                s.gpu_of.setdefault((r.node, r.rank), r.gpu_uuid)
            s.exec_us.append(ex)
            s.rows.append(rows)
        out.append(s)
    return out


def nic_nominal(view: FabricView) -> dict[tuple[str, str], float]:
    """(node, nic) -> the highest rate it reported: what the link trained at when healthy."""
    out: dict[tuple[str, str], float] = {}
    for n in view.nics:
        if n.rate_gbps:
            k = (n.node, n.nic)
            out[k] = max(out.get(k, 0.0), n.rate_gbps)
    return out


def as_jsonable(x: Any) -> Any:
    return None if isinstance(x, float) and not math.isfinite(x) else x


def comm_share(view: FabricView, window_s: float = 10.0) -> dict[tuple[str, str], float]:
    """(node, GPU) -> share of wall time its process spent inside collectives (sum over its
    communicators of calls x median exec time, over the span its windows cover). An upper bound
    on the share of step time lost to communication: overlapped communication is counted too."""
    busy: dict[tuple[str, str], float] = {}
    span: dict[tuple[str, str], tuple[float, float]] = {}
    for r in view.colls:
        if not r.gpu_uuid:
            continue
        k = (r.node, r.gpu_uuid)
        busy[k] = busy.get(k, 0.0) + r.count * r.exec_us_p50 / 1e6
        lo, hi = span.get(k, (r.ts, r.ts + window_s))
        span[k] = (min(lo, r.ts), max(hi, r.ts + window_s))
    return {k: min(1.0, busy[k] / (span[k][1] - span[k][0])) for k in busy if span[k][1] > span[k][0]}
