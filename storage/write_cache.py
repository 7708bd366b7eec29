"""What one writing process remembers between transactions, and the tuning windows that
decide how stale each memory may be. Nothing here is a source of truth: every entry only
saves a statement that would write what the database already holds, so evicting one (the
caches are bounded) or clearing all of them (the caller does after any failed transaction)
costs a few statements, never correctness."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any, TypeVar

from cachetools import TTLCache

K = TypeVar("K")
V = TypeVar("V")

STALE_JOB_S = 300.0  # a job nobody reported for this long has ended
GPU_SEEN_EVERY_S = 600.0  # gpus.last_seen granularity (nodes.last_seen is exact; nothing reads the GPU one)
# jobs.last_sample_ts granularity for a long-lived cache (the collector's): a job's row is
# shared by every node of the job, so updating it in every group commit would serialise
# concurrent collector processes on that row lock. Stale-job detection works in minutes.
JOB_TOUCH_EVERY_S = 15.0
# How long a GPU's open allocation read from the database is trusted without reading it
# again. Well below STALE_JOB_S: another process closes allocations only of jobs silent that
# long, and a GPU still sending samples of the job refreshes the entry long before.
ALLOC_TRUST_S = 60.0
NODE_SEEN_EVERY_S = 5.0  # nodes.last_seen granularity (agents flush every ~10 s anyway)
GPU_MOVE_AFTER_S = 600.0  # a GPU uuid may move to another node once its old node is silent this long
# A job description the agent keeps sending unchanged is written again after this long, so
# a row changed by someone else (an import, another collector's older view) converges back
# to what the agents report without a restart.
JOB_REWRITE_S = 300.0
# Bounds: far above a large fleet's live GPUs and jobs; a long-lived collector would
# otherwise remember every job it ever saw.
MAX_GPUS = 200_000
MAX_JOBS = 200_000


class BoundedDict(dict[K, V]):
    """A dict of at most ``maxsize`` entries: a new key past that drops the oldest-inserted
    eighth. Reads are plain dict reads (C speed): the write path looks up every GPU of a
    group commit several times, and cachetools' LRU bookkeeping (Python code per read) was
    ~0.4 us a row. Eviction order does not matter for correctness (see the module doc), and
    the bounds sit far above a fleet's live GPUs and jobs."""

    __slots__ = ("maxsize",)

    def __init__(self, maxsize: int) -> None:
        super().__init__()
        self.maxsize = maxsize

    def __setitem__(self, key: K, value: V) -> None:
        if len(self) >= self.maxsize and key not in self:
            # A chunk at a time: deleting one head entry per insert would leave the dict
            # scanning its deleted slots for the next oldest.
            for k in list(itertools.islice(iter(self), max(1, self.maxsize // 8))):
                del self[k]
        super().__setitem__(key, value)

    # dict.setdefault has overloads (default optional); this cache always takes a default
    def setdefault(self, key: K, default: V) -> V:  # type: ignore[override]
        if key in self:
            return self[key]
        self[key] = default
        return default

    def update(self, *args: Any, **kwargs: Any) -> None:
        for k, v in dict(*args, **kwargs).items():
            self[k] = v


@dataclass
class WriteCache:
    """Ids of dimension rows (immutable once created) and the last attributes written, so a
    steady stream of batches does not re-upsert unchanged nodes, GPUs and jobs. Per process;
    cleared by the caller after any failed transaction."""

    clusters: dict[str, int] = field(default_factory=dict)
    nodes: dict[tuple[int, str], int] = field(default_factory=dict)
    # uuid -> pk, node, attrs, when last_seen was written
    gpus: BoundedDict[str, tuple[int, int, tuple[Any, ...], float]] = field(
        default_factory=lambda: BoundedDict(MAX_GPUS))
    # (cluster, job id) -> pk, the description written (() = only referenced)
    jobs: TTLCache[tuple[int, str], tuple[int, tuple[Any, ...]]] = field(
        default_factory=lambda: TTLCache(MAX_JOBS, JOB_REWRITE_S, timer=time.monotonic))
    job_times: BoundedDict[int, tuple[float, float]] = field(
        default_factory=lambda: BoundedDict(MAX_JOBS))  # pk -> start, last written
    node_seen: dict[int, tuple[float, str]] = field(default_factory=dict)  # pk -> last_seen, version written
    # gpu_pk -> (open allocation's job_pk or None, its start, when read from the database)
    allocs: BoundedDict[int, tuple[int | None, float, float]] = field(
        default_factory=lambda: BoundedDict(MAX_GPUS))

    def clear(self) -> None:
        self.clusters.clear()
        self.nodes.clear()
        self.gpus.clear()
        self.jobs.clear()
        self.job_times.clear()
        self.node_seen.clear()
        self.allocs.clear()
