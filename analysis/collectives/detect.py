"""Pure decisions over a job's collectives and fabric (docs/nccl.md).

* ``slow_episodes``: per series, bus bandwidth per bin against the job's own baseline (a high
  quantile of the series' bins: the best it sustained), episodes of bins ``drop`` below it lasting
  ``min_duration_s``.
* ``localise``: who explains an episode. In a ring or tree every rank waits for the slowest link,
  so the rank behind it enters each collective last and *waits least*: its exec time is the
  shortest while its peers' grow. That names a (node, rank, GPU); the GPU's rail names the NIC.
  The NIC counters (link rate below what it trained at, ``port_xmit_wait`` climbing, a port not
  ACTIVE) name a NIC on their own and confirm the timing when both agree.
* ``error_ports``: ports whose error counters grew during the job.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from .features import FabricView, NicRow, Series, SeriesKey, nic_nominal

ERROR_KEYS = ("port_rcv_errors", "symbol_error", "link_downed", "local_link_integrity_errors",
              "excessive_buffer_overrun_errors", "port_rcv_remote_physical_errors", "link_error_recovery",
              "packet_seq_err", "out_of_sequence", "local_ack_timeout_err")


@dataclass(frozen=True)
class SlowParams:
    bin_s: float = 60.0
    drop: float = 0.25  # busbw this far below the baseline is slow
    min_duration_s: float = 180.0
    baseline_quantile: float = 0.9
    min_baseline_bins: int = 5
    min_calls_per_bin: int = 4


@dataclass(frozen=True)
class LocaliseParams:
    late_ratio: float = 0.8  # the late rank's exec time at most this share of its peers' median
    late_share: float = 0.5  # ... and the shortest in at least this share of the episode's bins
    rate_drop: float = 0.1  # a link below (1 - this) of the rate it trained at
    xmit_wait_ratio: float = 10.0  # port_xmit_wait per second this many times its level before
    xmit_wait_min_per_s: float = 1e4  # and at least this many ticks per second


@dataclass
class SlowEpisode:
    key: SeriesKey
    n_nodes: int
    start: float
    end: float
    ongoing: bool
    baseline_gbs: float
    observed_gbs: float
    bins: list[int]  # indices into the series' bins
    lost_gpu_s: float  # GPU-seconds the slower collectives took beyond the baseline's speed

    @property
    def drop(self) -> float:
        return 1.0 - self.observed_gbs / self.baseline_gbs if self.baseline_gbs > 0 else 0.0


@dataclass
class NicEvidence:
    node: str
    nic: str
    rate_gbps: float | None
    nominal_gbps: float | None
    xmit_wait_per_s: float | None
    xmit_wait_before_per_s: float | None
    state: str | None
    basis: list[str] = field(default_factory=list)  # link_rate, xmit_wait, port_state

    @property
    def strength(self) -> float:
        s = 0.0
        if "port_state" in self.basis:
            s += 3
        if "link_rate" in self.basis:
            s += 2
        if "xmit_wait" in self.basis:
            s += 1
        return s


@dataclass
class Culprit:
    node: str
    nic: str | None
    rank: int | None
    gpu_uuid: str | None
    exec_ratio: float | None  # the late rank's exec time / its peers' median during the episode
    basis: list[str]
    confidence: str
    nic_evidence: NicEvidence | None


def _quantile(vals: list[float], q: float) -> float:
    s = sorted(vals)
    return s[max(0, min(len(s) - 1, math.ceil(q * len(s)) - 1))]


def slow_episodes(series: list[Series], p: SlowParams) -> list[SlowEpisode]:
    out = []
    for s in series:
        ok = [i for i, b in enumerate(s.busbw) if not math.isnan(b) and s.calls[i] >= p.min_calls_per_bin]
        if len(ok) < p.min_baseline_bins:
            continue
        base = _quantile([s.busbw[i] for i in ok], p.baseline_quantile)
        if base <= 0:
            continue
        for i in ok:  # time the collectives lost against the baseline's speed (bandwidth-bound share)
            s.lost_us[i] = sum(r.count * r.exec_us_p50 * max(0.0, 1.0 - (r.busbw_gbs_p50 or base) / base)
                               for r in s.rows[i])
        slow = [i for i in ok if s.busbw[i] < (1.0 - p.drop) * base]
        runs: list[list[int]] = []
        for i in slow:
            pos = ok.index(i)
            if runs and ok.index(runs[-1][-1]) == pos - 1:
                runs[-1].append(i)
            else:
                runs.append([i])
        for run in runs:
            start, end = s.bins[run[0]], s.bins[run[-1]] + p.bin_s
            if end - start < p.min_duration_s:
                continue
            obs = statistics.median(s.busbw[i] for i in run)
            out.append(SlowEpisode(s.key, s.n_nodes, start, end, run[-1] == ok[-1], base, obs, run,
                                   sum(s.lost_us[i] for i in run) / 1e6))
    return out


def _rate(rows: list[NicRow]) -> float | None:
    vals = [r.xmit_wait / r.interval_s for r in rows if r.xmit_wait is not None and r.interval_s > 0]
    return statistics.median(vals) if vals else None


def nic_evidence(view: FabricView, start: float, end: float, nodes: set[str], p: LocaliseParams) -> list[NicEvidence]:
    nominal = nic_nominal(view)
    by: dict[tuple[str, str], list[NicRow]] = {}
    for n in view.nics:
        if n.node in nodes:
            by.setdefault((n.node, n.nic), []).append(n)
    out = []
    for (node, nic), rows in sorted(by.items()):
        before = [r for r in rows if r.ts <= start]
        during = [r for r in rows if start < r.ts <= end]
        if not during:
            continue
        rates = [r.rate_gbps for r in during if r.rate_gbps is not None]
        nom = nominal.get((node, nic))
        ev = NicEvidence(node, nic, min(rates) if rates else None, nom, _rate(during), _rate(before),
                         next((r.state for r in during if r.state and r.state != "ACTIVE"), during[-1].state))
        if rates and nom and min(rates) < (1.0 - p.rate_drop) * nom:
            ev.basis.append("link_rate")
        w, w0 = ev.xmit_wait_per_s, ev.xmit_wait_before_per_s
        if w is not None and w >= p.xmit_wait_min_per_s and (w0 is None or w >= p.xmit_wait_ratio * max(w0, 1.0)):
            ev.basis.append("xmit_wait")
        if ev.state is not None and ev.state != "ACTIVE":
            ev.basis.append("port_state")
        out.append(ev)
    return out


def late_rank(s: Series, ep: SlowEpisode, p: LocaliseParams) -> tuple[tuple[str, int], float] | None:
    """The (node, rank) that waits least during the episode, and its exec ratio to its peers."""
    ratios: dict[tuple[str, int], list[float]] = {}
    shortest: dict[tuple[str, int], int] = {}
    for i in ep.bins:
        ex = s.exec_us[i]
        if len(ex) < 3:
            continue
        med = statistics.median(ex.values())
        if med <= 0:
            continue
        for k, v in ex.items():
            ratios.setdefault(k, []).append(v / med)
        low = min(ex, key=ex.__getitem__)
        shortest[low] = shortest.get(low, 0) + 1
    if not ratios:
        return None
    k = min(ratios, key=lambda x: statistics.median(ratios[x]))
    r = statistics.median(ratios[k])
    n = len(ratios[k])
    if r > p.late_ratio or shortest.get(k, 0) < p.late_share * n:
        return None
    # a rank that is always first (a different code path, a leader) is not a symptom
    before = []
    in_ep = set(ep.bins)
    for i, ex in enumerate(s.exec_us):
        if i not in in_ep and s.bins[i] < ep.start and k in ex and len(ex) >= 3:
            before.append(ex[k] / statistics.median(ex.values()))
    if before and statistics.median(before) <= p.late_ratio:
        return None
    return k, r


def localise(view: FabricView, series: Series, ep: SlowEpisode, p: LocaliseParams) -> Culprit | None:
    nodes = {n for rows in series.rows for n in (r.node for r in rows)}
    evidence = [e for e in nic_evidence(view, ep.start, ep.end, nodes, p) if e.basis]
    late = late_rank(series, ep, p) if ep.n_nodes > 1 else None
    if late is not None:
        (node, rank), ratio = late
        gpu = series.gpu_of.get((node, rank))
        rail = [n for n in view.rails.get(gpu or "", [])] if gpu else []
        on_rail = [e for e in evidence if e.node == node and e.nic in rail]
        on_node = [e for e in evidence if e.node == node]
        pick = max(on_rail or on_node, key=lambda e: e.strength, default=None)
        if pick is not None:
            return Culprit(node, pick.nic, rank, gpu, ratio, ["timing", *pick.basis], "high", pick)
        nic = rail[0] if len(rail) == 1 else None
        return Culprit(node, nic, rank, gpu, ratio, ["timing"], "medium" if nic else "low", None)
    if evidence:
        pick = max(evidence, key=lambda e: e.strength)
        return Culprit(pick.node, pick.nic, None, None, None, list(pick.basis), "medium", pick)
    return None


@dataclass
class ErrorPort:
    node: str
    nic: str
    errors: float
    by_counter: dict[str, float]
    first_ts: float
    last_ts: float


def error_ports(view: FabricView, errors_min: float, link_downed_min: float) -> list[ErrorPort]:
    by: dict[tuple[str, str], ErrorPort] = {}
    for n in view.nics:
        grown = {k: v for k, v in n.counters.items() if k in ERROR_KEYS and v > 0}
        if not grown:
            continue
        e = by.get((n.node, n.nic))
        if e is None:
            e = by[(n.node, n.nic)] = ErrorPort(n.node, n.nic, 0.0, {}, n.ts, n.ts)
        for k, v in grown.items():
            e.by_counter[k] = e.by_counter.get(k, 0.0) + v
            e.errors += v
        e.first_ts, e.last_ts = min(e.first_ts, n.ts), max(e.last_ts, n.ts)
    return [e for _, e in sorted(by.items())
            if e.errors >= errors_min or e.by_counter.get("link_downed", 0.0) >= link_downed_min]
