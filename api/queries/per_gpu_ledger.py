"""The per-GPU CSV's ledger columns: each GPU's allocated, productive, wasted and unobserved
GPU-hours from the job's GPU-time ledger (the report's ``ledger.by_gpu``; analysis/ledger.py),
so the CSV adds up to the same totals as the job page and ``GET /api/v1/jobs/{id}/ledger``."""

from __future__ import annotations

from typing import Any

LEDGER_COLUMNS = ("allocated_gpu_hours", "productive_gpu_hours", "wasted_gpu_hours", "unobserved_gpu_hours")
_NOT_WASTE = ("productive", "unobserved")


def with_ledger(rows: list[dict[str, Any]], report: dict[str, Any] | None) -> list[dict[str, Any]]:
    """``rows`` (per-GPU report rows with ``gpu_uuid``) with the ledger columns; empty cells (not
    zero) where the job has no ledger yet: unknown is not zero."""
    by_gpu = {g.get("gpu_uuid"): g.get("categories") or {}
              for g in ((report or {}).get("ledger") or {}).get("by_gpu") or []}
    out = []
    for r in rows:
        cats = by_gpu.get(r.get("gpu_uuid"))
        if cats is None:
            out.append(r)
            continue
        out.append({**r, "allocated_gpu_hours": round(sum(cats.values()), 4),
                    "productive_gpu_hours": round(cats.get("productive", 0.0), 4),
                    "wasted_gpu_hours": round(sum(v for k, v in cats.items() if k not in _NOT_WASTE), 4),
                    "unobserved_gpu_hours": round(cats.get("unobserved", 0.0), 4)})
    return out
