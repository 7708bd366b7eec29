"""hw_fault: per node, critical XIDs, new double-bit ECC errors, row-remap failures, NVLink
CRC errors or PCIe replays during the job, from counters and agent events."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from gpufleet.flagkinds import flag_kinds

from ..config import KindConfig
from .base import CounterMinutes, Finding, Found, JobView, Signals

KIND = "hw_fault"
SIGNALS = Signals()  # error counters and agent events, whatever else is measured

# What was seen on a GPU -> the cause whose suggestion fits (registry: suggestion_by_cause),
# most serious first: a node's finding names the most serious cause any of its GPUs shows.
CAUSE_XIDS = {79: "fell_off_bus", 64: "row_remap", 63: "row_remap", 48: "memory_ecc", 94: "memory_ecc",
              95: "memory_ecc", 140: "memory_ecc", 92: "memory_ecc", 74: "nvlink", 119: "gsp", 120: "gsp"}
CAUSE_KEYS = {"event_fell_off_bus": "fell_off_bus", "row_remap_failure": "row_remap",
              "event_row_remap_failure": "row_remap", "ecc_dbe_new": "memory_ecc", "event_ecc_dbe": "memory_ecc",
              "nvlink_errors_new": "nvlink", "event_nvlink_error": "nvlink", "pcie_replays_new": "pcie"}
CAUSE_ORDER = ("fell_off_bus", "row_remap", "memory_ecc", "nvlink", "gsp", "pcie")


def cause_of(items: list[dict[str, Any]]) -> str | None:
    """The most serious cause among the faulty GPUs' findings (None: nothing this table knows)."""
    found = {CAUSE_KEYS[k] for it in items for k in it if k in CAUSE_KEYS}
    found |= {CAUSE_XIDS[it["xid"]] for it in items if it.get("xid") in CAUSE_XIDS}
    return next((c for c in CAUSE_ORDER if c in found), None)


@dataclass(frozen=True, kw_only=True)
class Config(KindConfig):
    SECTION: ClassVar[str] = KIND
    min_duration_s: float = 0.0  # one fault is enough
    critical_xids: tuple[int, ...]
    nvlink_errors_min: float  # CRC flit errors added during the job
    pcie_replays_min: float


def detect(job: JobView, cfg: Config, found: Found) -> list[Finding]:
    ctx, c = job.ctx, job.counters
    crit = set(cfg.critical_xids)
    g = job.n_gpus
    per_gpu: list[dict[str, Any]] = [{} for _ in range(g)]
    first: list[float | None] = [None] * g

    def note(i: int, key: str, value: Any, ts: float) -> None:
        per_gpu[i].setdefault(key, value)
        prev = first[i]
        first[i] = ts if prev is None else min(prev, ts)

    def minute_ts(m: int) -> float:
        return float((c.b0 + m) * 60)

    for i, key, value, m in _counter_hits(c, cfg) if c.xid_crit.size else ():
        note(i, key, value, minute_ts(m))
    for ts, row, kind, code in job.events:
        if row is None or not (0 <= row < g):
            continue
        if kind == "xid" and code is not None and int(code) in crit:
            note(row, "xid", int(code), ts)
        elif kind in ("ecc_dbe", "row_remap_failure", "nvlink_error", "fell_off_bus"):
            note(row, f"event_{kind}", code if code is not None else 1, ts)
    spec = flag_kinds().get(KIND)
    out: list[Finding] = []
    noted = [i for i in range(g) if per_gpu[i]]
    for node in dict.fromkeys(ctx.gpu_nodes) if noted else ():
        rows = [i for i in noted if ctx.gpu_nodes[i] == node]
        if not rows:
            continue
        start = min(first[i] or ctx.last_ts for i in rows)
        items = [{"gpu_uuid": ctx.gpu_uuids[i], **per_gpu[i]} for i in rows][:16]
        cause = cause_of(items)
        evidence: dict[str, Any] = {"gpus": items, "critical_xids": sorted(crit), **({"cause": cause} if cause else {})}
        out.append(Finding(KIND, node, cfg.severity or spec.severity, max(ctx.first_ts, start), ctx.last_ts, True,
                           0.0, evidence, spec.suggestion_for(ctx.workload_class, cause)))
    return out


def _counter_hits(c: CounterMinutes, cfg: Config) -> list[tuple[int, str, int, int]]:
    """(GPU row, key, value, first minute) of what the minute counters show, per GPU in the
    order xid, row remap, ECC, NVLink, PCIe (the evidence's key order). One numpy pass per
    counter over all GPUs: the common case (nothing wrong) costs no per-GPU Python."""
    g = c.xid_crit.shape[0]
    found: list[tuple[str, np.ndarray, np.ndarray, np.ndarray]] = []  # key, (G,) hit, first minute, value
    hit_x = c.xid_crit > 0  # NaN compares False: an unmeasured minute is no XID
    if hit_x.any():  # (a key no GPU hit adds nothing below: the usual case skips its argmax)
        first_x = hit_x.argmax(axis=1)
        xid_at_first = np.take_along_axis(c.xid_crit, first_x[:, None], axis=1)[:, 0]
        found.append(("xid", np.asarray(hit_x.any(axis=1)), first_x, xid_at_first))
    hit_r = c.remap_max >= 1
    if hit_r.any():
        found.append(("row_remap_failure", np.asarray(hit_r.any(axis=1)), hit_r.argmax(axis=1), np.ones(g)))
    for key, hi, lo, need in (("ecc_dbe_new", c.ecc_max, c.ecc_min, 1.0),
                              ("nvlink_errors_new", c.nvl_err_max, c.nvl_err_min, cfg.nvlink_errors_min),
                              ("pcie_replays_new", c.replay_max, c.replay_min, cfg.pcie_replays_min)):
        # Nothing can reach ``need`` when the highest reading minus the lowest (any baseline is
        # one of them) stays below it: the usual all-zero counters cost three reductions (in
        # Python floats, which never warn: NaN where nothing was measured fails the test).
        lo_min, hi_min = float(np.fmin.reduce(lo, axis=None)), float(np.fmin.reduce(hi, axis=None))
        lowest = hi_min if lo_min != lo_min else lo_min if hi_min != hi_min else min(lo_min, hi_min)  # np.fmin
        if not float(np.fmax.reduce(hi, axis=None)) - lowest >= need:
            continue
        ok = ~np.isnan(hi)
        have = ok.any(axis=1)
        # Counters are cumulative since driver load: count what the job added (a
        # reset makes a step down, which is not an error). The baseline is the job's lowest
        # reading, else (no minimum measured) its first maximum.
        series = np.fmax.accumulate(np.where(ok, hi, -np.inf), axis=1)
        lo_ok = ~np.isnan(lo)
        first_hi = np.take_along_axis(hi, ok.argmax(axis=1)[:, None], axis=1)[:, 0]
        base = np.where(lo_ok.any(axis=1), np.fmin.reduce(np.where(lo_ok, lo, np.inf), axis=1), first_hi)
        with np.errstate(invalid="ignore"):
            over = (series - base[:, None]) >= need
        found.append((key, have & over.any(axis=1), over.argmax(axis=1), series[:, -1] - base))
    out: list[tuple[int, str, int, int]] = []
    for i in np.flatnonzero(np.any([f[1] for f in found], axis=0)) if found else ():
        out += [(int(i), key, int(value[i]), int(first[i])) for key, hit, first, value in found if hit[i]]
    return out
