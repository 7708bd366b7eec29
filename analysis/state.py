"""Per-job state kept between analysis runs in one process.

A running job is re-analyzed every 30-60 s. Its minute features are folded at ingest
(storage.minute_features), so a pass reads feature rows, never raw samples; each process
keeps the rows it read per job-hour with that hour's fold counter (``job_hist_features.folds``,
bumped by every batch folded into the hour) and re-reads only the hours whose counter moved,
late batches included. The features are rebuilt from the kept rows exactly as a cold read
builds them, so the state is a pure cache: a new worker process reads more, and reports the
same, bit for bit."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from .features import MinuteFeatures, empty_histograms


@dataclass
class JobState:
    gpu_pks: list[int]
    feats: MinuteFeatures
    hist_all: dict[str, np.ndarray] = field(default_factory=empty_histograms)
    chunks: dict[int, np.ndarray] = field(default_factory=dict)  # hour -> feature rows read
    folds: dict[int, int] = field(default_factory=dict)  # hour -> its fold counter when read
    first_ts: float | None = None
    last_ts: float | None = None

    def nbytes(self) -> int:
        return int(self.feats.n.nbytes + sum(v.nbytes for v in self.feats.f.values())
                   + sum(v.nbytes for v in self.chunks.values()))

    def hist(self) -> dict[str, np.ndarray]:
        return self.hist_all


class StateCache:
    """An LRU of JobState by (database, job pk), bounded in jobs and in bytes (a 24-hour
    64-GPU job holds ~25 MB of minute features; evicting one only costs a re-read)."""

    def __init__(self, max_jobs: int = 4096, max_bytes: int | None = None) -> None:
        self.max_jobs = max_jobs
        # The server's size comes from settings (analysis.cache_mb, GPUFLEET_ANALYSIS_CACHE_MB).
        self.max_bytes = max_bytes if max_bytes is not None else 512 * 2**20
        self._d: OrderedDict[tuple[str, int], JobState] = OrderedDict()
        self._sizes: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()

    def get(self, key: tuple[str, int]) -> JobState | None:
        with self._lock:
            st = self._d.get(key)
            if st is not None:
                self._d.move_to_end(key)
            return st

    def put(self, key: tuple[str, int], st: JobState) -> None:
        with self._lock:
            self._d[key] = st
            self._d.move_to_end(key)
            self._sizes[key] = st.nbytes()
            total = sum(self._sizes.values())
            while len(self._d) > 1 and (len(self._d) > self.max_jobs or total > self.max_bytes):
                old, _ = self._d.popitem(last=False)
                total -= self._sizes.pop(old, 0)

    def drop(self, key: tuple[str, int]) -> None:
        with self._lock:
            self._d.pop(key, None)
            self._sizes.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._d.clear()
            self._sizes.clear()

    def nbytes(self) -> int:
        return sum(self._sizes.values())

    def __len__(self) -> int:
        return len(self._d)


CACHE = StateCache()
