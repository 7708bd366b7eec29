"""Byte budgets for the receiver's caches that senders feed (issue 38 finding 10: 60 bodies of
100k metadata family names took a collector from 119 to 1,037 MB, never released; the series
cache was bounded by count, whatever its keys' sizes).

Each cache charges what an entry costs it (the key's bytes and a fixed estimate of the entry's
objects); a charge that would pass the limit empties the cache first, as the count bounds
always did: these are caches of what a sender repeats, rebuilt on the next bodies, never state
that is lost. /metrics shows each budget's bytes, limit and evictions
(``gpufleet_remote_write_cache_*{cache}``)."""

from __future__ import annotations

# What one dict entry costs beyond its key's bytes: the dict slot, the key object, the value
# (a small tuple, a Mapped record, a bool). Measured with tracemalloc on CPython 3.11: 150-400.
ENTRY_OVERHEAD = 256

SERIES_BYTES = 256 << 20  # label encodings -> mapped series (200k series of ~300 label bytes: ~110 MiB)
FAMILY_BYTES = 8 << 20  # metadata family names -> counter or not (dcgm-exporter has ~100)
DIMS_BYTES = 32 << 20  # (gpus, jobs) lists that passed their checks
LABEL_VALUES_BYTES = 64 << 20  # per-GPU values remembered from labels (memory totals), NCCL snapshots
# serving replicas' scrapes being assembled, last snapshots and open minutes (collector/serving_remote_write.py):
# ~105 KB a vLLM replica scraped every 15 s, ~300 KB every 1 s (tracemalloc), so ~2,500 / ~900 replicas;
# past it their open minutes are lost (counted)
SERVING_BYTES = 256 << 20


class ByteBudget:
    def __init__(self, name: str, limit: int) -> None:
        self.name = name
        self.limit = limit
        self.used = 0
        self.evictions = 0  # times the cache was emptied to stay within ``limit``

    def charge(self, n: int) -> bool:
        """Account ``n`` more bytes; True when the owner must empty its cache first (then the
        budget holds just these ``n``)."""
        if self.used + n > self.limit:
            self.evictions += 1
            self.used = n
            return True
        self.used += n
        return False

    def reset(self) -> None:
        """The owner emptied its cache for its own reasons (a count bound)."""
        self.used = 0


def entry_bytes(*parts: object) -> int:
    """What an entry keyed by ``parts`` (str/bytes) costs its cache, roughly."""
    return ENTRY_OVERHEAD + sum(len(p) for p in parts if isinstance(p, (str, bytes)))
