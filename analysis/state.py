"""Per-job incremental state kept between analysis runs in one process.

A running job is re-analyzed every 30-60 s; re-reading a 24-hour job's samples each time
would not scale, so each process keeps the job's per-minute features and histograms and
reads only the samples since ``reread_from`` (a minute boundary a little before the newest
sample, so agents flushing late are still counted). The state is a cache: losing it (a new
worker process) only costs one full read of the job, the results are the same."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from .features import MinuteFeatures, add_histograms, empty_histograms


@dataclass
class JobState:
    gpu_pks: list[int]
    feats: MinuteFeatures
    hist_before: dict[str, np.ndarray] = field(default_factory=empty_histograms)  # samples before reread_from
    hist_tail: dict[str, np.ndarray] = field(default_factory=empty_histograms)  # samples since
    reread_from: float = float("-inf")
    first_ts: float | None = None
    last_ts: float | None = None

    def nbytes(self) -> int:
        return int(self.feats.n.nbytes + sum(v.nbytes for v in self.feats.f.values()))

    def hist(self) -> dict[str, np.ndarray]:
        return add_histograms(self.hist_before, self.hist_tail)

    def add_gpus(self, pks: list[int]) -> None:
        """Grow the GPU axis for GPUs that joined the job (rows appended, no data before)."""
        new = [p for p in pks if p not in self.gpu_pks]
        if not new:
            return
        self.gpu_pks.extend(new)
        f = self.feats
        extra = len(new)
        m = f.shape[1]
        f.n = np.concatenate([f.n, np.zeros((extra, m))], axis=0)
        f.f = {k: np.concatenate([v, np.full((extra, m), np.nan)], axis=0) for k, v in f.f.items()}


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
