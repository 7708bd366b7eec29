"""The reference the engine is compared with: what GPU_UTIL-based tools conclude (Princeton
jobstats / Job Defense Shield style rules, nvidia-smi, dcgm-exporter's default dashboard),
computed from the same rendered samples the engine received.

Rules, per job over its whole run, from ``gpu_util`` only: every GPU's mean < 1% -> idle_gpu;
some GPUs < 1% while others work -> oversized_allocation; the job's mean utilisation <= 25%
(jobstats' red threshold) -> low_sm_activity. It cannot express the other kinds."""

from __future__ import annotations

import numpy as np

from .feed import RenderedJob


def reference_kinds(rj: RenderedJob) -> list[str]:
    means = []
    for r in rj.gpus:
        u = r.cols.get("gpu_util")
        if u is None:
            continue
        u = u[~np.isnan(u)]
        if u.size:
            means.append(float(u.mean()))
    if not means:
        return []
    m = np.asarray(means)
    if (m < 0.01).all():
        return ["idle_gpu"]
    out = ["oversized_allocation"] if (m < 0.01).any() else []
    if m.mean() <= 0.25:
        out.append("low_sm_activity")
    return out
