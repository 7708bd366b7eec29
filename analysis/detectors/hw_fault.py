"""hw_fault: per node, critical XIDs, new double-bit ECC errors, row-remap failures, NVLink
CRC errors or PCIe replays during the job, from counters and agent events."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from gpufleet.flagkinds import flag_kinds

from ..config import KindConfig
from .base import Finding, Found, JobView, Signals

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

    for i in range(g):
        hit = np.flatnonzero(np.nan_to_num(c.xid_crit[i]) > 0)
        if len(hit):
            note(i, "xid", int(c.xid_crit[i][hit[0]]), minute_ts(int(hit[0])))
        rm = np.flatnonzero(np.nan_to_num(c.remap_max[i]) >= 1)
        if len(rm):
            note(i, "row_remap_failure", 1, minute_ts(int(rm[0])))
        for key, hi, lo, need in (("ecc_dbe_new", c.ecc_max[i], c.ecc_min[i], 1.0),
                                  ("nvlink_errors_new", c.nvl_err_max[i], c.nvl_err_min[i], cfg.nvlink_errors_min),
                                  ("pcie_replays_new", c.replay_max[i], c.replay_min[i], cfg.pcie_replays_min)):
            ok = ~np.isnan(hi)
            if not ok.any():
                continue
            # Counters are cumulative since driver load: count what the job added (a
            # reset makes a step down, which is not an error).
            series = np.fmax.accumulate(np.where(ok, hi, -np.inf))
            base = float(np.nanmin(lo)) if np.any(~np.isnan(lo)) else float(hi[ok][0])
            added = series - base
            hit = np.flatnonzero(added >= need)
            if len(hit):
                note(i, key, int(added[-1]), minute_ts(int(hit[0])))
    for ts, row, kind, code in job.events:
        if row is None or not (0 <= row < g):
            continue
        if kind == "xid" and code is not None and int(code) in crit:
            note(row, "xid", int(code), ts)
        elif kind in ("ecc_dbe", "row_remap_failure", "nvlink_error", "fell_off_bus"):
            note(row, f"event_{kind}", code if code is not None else 1, ts)
    spec = flag_kinds().get(KIND)
    out: list[Finding] = []
    for node in dict.fromkeys(ctx.gpu_nodes):
        rows = [i for i in range(g) if ctx.gpu_nodes[i] == node and per_gpu[i]]
        if not rows:
            continue
        start = min(first[i] or ctx.last_ts for i in rows)
        items = [{"gpu_uuid": ctx.gpu_uuids[i], **per_gpu[i]} for i in rows][:16]
        cause = cause_of(items)
        evidence: dict[str, Any] = {"gpus": items, "critical_xids": sorted(crit), **({"cause": cause} if cause else {})}
        out.append(Finding(KIND, node, cfg.severity or spec.severity, max(ctx.first_ts, start), ctx.last_ts, True,
                           0.0, evidence, spec.suggestion_for(ctx.workload_class, cause)))
    return out
