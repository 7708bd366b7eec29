"""Workload classes from scheduler metadata (pure): training, serving, batch_inference,
interactive, hpc. The rules and advice of some detectors depend on it: a serving replica that
idles between requests is over-provisioned, never input-stalled; an FP32 HPC code has no
tensor-core path to enable.

Order of evidence (first that speaks wins): an explicit label (``gpufleet.io/workload``,
``workload-class`` or ``workload_class``), the Kubernetes owner kind, the Slurm partition and
QoS, then words in the job's name, application label and namespace. Nothing speaks: None (the
detectors then apply the rules that hold for any workload)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpufleet.flagkinds import WORKLOAD_CLASSES

from .restarts import restarts
from .windows import masked_median

CRASH_LOOP_RESTARTS = 3  # restarts that make a loop (thresholds.toml [crash_loop] min_restarts' default)

OVERRIDE_LABELS = ("gpufleet.io/workload", "workload-class", "workload_class")
OWNER_KINDS = {
    "deployment": "serving", "replicaset": "serving", "statefulset": "serving", "inferenceservice": "serving",
    "knativeservice": "serving", "rayservice": "serving",
    "pytorchjob": "training", "tfjob": "training", "mpijob": "training", "jaxjob": "training", "xgboostjob": "training",
    "notebook": "interactive",
}
# Whole words (split on - _ . / and digits) in names, partitions, QoS, app labels, namespaces.
WORDS = (
    ("interactive", ("jupyter", "jupyterhub", "notebook", "notebooks", "interactive", "ipykernel", "vscode",
                     "sandbox")),
    ("serving", ("serve", "serving", "vllm", "tgi", "triton", "tritonserver", "sglang", "inference-server",
                 "endpoint")),
    ("training", ("train", "training", "pretrain", "finetune", "fine-tune", "sft", "rlhf", "dpo", "lora")),
    ("batch_inference", ("infer", "inference", "batch-infer", "embed", "embedding", "embeddings", "offline")),
    ("hpc", ("hpc", "md", "gromacs", "lammps", "namd", "amber", "cp2k", "vasp", "openfoam", "cfd", "wrf",
             "climate", "lattice", "milc", "simulation", "solver")),
)


@dataclass(frozen=True)
class WorkloadClass:
    name: str | None
    reason: str  # how it was decided (shown in the report)

    def as_json(self) -> dict[str, str | None]:
        return {"class": self.name, "from": self.reason}


def _words(text: str | None) -> set[str]:
    if not text:
        return set()
    t = text.lower()
    parts = set(re.split(r"[^a-z]+", t))
    # hyphenated names match multi-part words too ("batch-infer", "inference-server")
    return parts | {m.group(0) for m in re.finditer(r"[a-z]+-[a-z]+", t)}


def classify(*, source: str | None = None, name: str | None = None, partition: str | None = None,
             namespace: str | None = None, labels: Mapping[str, Any] | None = None) -> WorkloadClass:
    labels = labels or {}
    for key in OVERRIDE_LABELS:
        v = labels.get(key)
        if isinstance(v, str) and v.lower() in WORKLOAD_CLASSES:
            return WorkloadClass(v.lower(), f"label {key}")
    owner = str(labels.get("owner_kind") or "").lower()
    if owner in OWNER_KINDS:
        return WorkloadClass(OWNER_KINDS[owner], f"Kubernetes owner {labels.get('owner_kind')}")
    for where, text in (("partition", partition), ("QoS", labels.get("qos") if isinstance(labels.get("qos"), str)
                                                    else None)):
        w = _words(text)
        for cls, words in WORDS:
            if w & set(words):
                return WorkloadClass(cls, f"{where} {text}")
    app = labels.get("app.kubernetes.io/name") or labels.get("app")
    for where, text in (("name", name), ("app", app if isinstance(app, str) else None), ("namespace", namespace)):
        w = _words(text)
        for cls, words in WORDS:
            if w & set(words):
                return WorkloadClass(cls, f"{where} {text}")
    return WorkloadClass(None, "no scheduler metadata names it")


def _percentile(s: list[float], q: float) -> float:
    """``np.percentile(s, 100 * q)`` (its default, linear method) of sorted, NaN-free ``s``, with
    its arithmetic step for step (the same float result): np.percentile costs ~50 us a call on
    a job's dozen windows, this ~1."""
    n = len(s)
    v = (n - 1) * q
    if v >= n - 1:
        return s[-1]
    lo = math.floor(v)
    gamma = v - lo
    a, b = s[lo], s[lo + 1]
    d = b - a
    return b - d * (1 - gamma) if gamma >= 0.5 else a + d * gamma  # numpy's _lerp


def from_pattern(busy_frac: np.ndarray, valid: np.ndarray, fb_used: np.ndarray | None = None) -> WorkloadClass | None:
    """Request-driven or not, from the busy share of the GPUs' windows (G x K), for jobs whose
    metadata names no class. A training loop that alternates (an input stall) does so at its
    step's rhythm, so its windows' busy share stays put; a replica's follows its traffic, which
    swings (diurnal, bursts). Steady alternation stays undecided: it may be either.

    ``fb_used`` (G x M, GPU memory per minute): a job whose memory keeps going back to zero is
    restarting (``analysis/restarts.py``), and its busy share swings because it keeps dying,
    not because requests come and go: undecided, never ``serving``."""
    if fb_used is not None and len(restarts(fb_used)) >= CRASH_LOOP_RESTARTS:
        return None
    # masked_median, not np.nanmedian (masked arrays: 50x slower here); all-NaN windows: no
    # data, NaN, skipped below.
    per_window = masked_median(busy_frac, valid) if busy_frac.size else busy_frac
    x = per_window[~np.isnan(per_window)] if per_window.size else per_window
    if len(x) < 6:
        return None
    alternating = (x > 0.05) & (x < 0.95)
    if alternating.mean() < 0.5:
        return None  # mostly steady (or idle): nothing request-driven to see
    s = sorted(x.tolist())
    spread = _percentile(s, 90 / 100) - _percentile(s, 10 / 100)
    if spread >= 0.35:
        return WorkloadClass("serving", f"pattern: busy share swings {spread:.0%} between windows (request-driven)")
    return None
