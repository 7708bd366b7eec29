"""Which shard a job belongs to: the pure partition behind the sharded analysis pass
(``analysis.tasks.analyze_shard`` and ``analyze_progress_shard``; docs/goodput.md, "Sharded
analysis").

A job's shard must not depend on the process asking (Python's ``hash()`` is salted per process
for strings, so two workers would disagree) nor on which other jobs are due, so it is a function
of the job's key alone: BLAKE2b of the key's text, then Lamping & Veach's jump consistent hash
("A Fast, Minimal Memory, Consistent Hash Algorithm", 2014) onto ``n`` buckets. Jump hashing
moves only about 1/(n+1) of the jobs when ``analysis.shards`` grows from ``n`` to ``n + 1``
(a plain ``% n`` moves almost all of them), so changing the setting keeps most jobs on the shard
they were on, which matters only for how warm the workers' caches are: correctness never
depends on which shard a job is in."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

_MASK64 = (1 << 64) - 1
_JUMP_MULT = 2862933555777941757  # the 64-bit LCG of the paper


def stable_key(key: int | str) -> int:
    """A 64-bit integer from ``key``, the same in every process and Python version."""
    return int.from_bytes(hashlib.blake2b(str(key).encode(), digest_size=8).digest(), "little")


def jump_hash(key64: int, n: int) -> int:
    """Bucket in ``range(n)`` for a 64-bit key (jump consistent hash)."""
    if n < 1:
        raise ValueError(f"the number of shards must be >= 1, not {n}")
    b, j = -1, 0
    k = key64 & _MASK64
    while j < n:
        b = j
        k = (k * _JUMP_MULT + 1) & _MASK64
        j = int((b + 1) * (float(1 << 31) / float((k >> 33) + 1)))
    return b


def shard_of(key: int | str, n: int) -> int:
    """The shard (0 .. n-1) of one job, keyed by its primary key (jobs.id)."""
    return jump_hash(stable_key(key), n)


def partition(keys: Iterable[int], n: int) -> list[list[int]]:
    """``keys`` split into ``n`` lists by ``shard_of``, each in the order the keys came."""
    out: list[list[int]] = [[] for _ in range(max(n, 0))]
    for k in keys:
        out[shard_of(k, n)].append(k)
    return out


def shard_lock_key(shard: int, n: int) -> str:
    """The Redis lock of one shard. ``n`` is part of the name: shards of a different count
    cover different jobs, so they do not exclude each other (a pass under the old count and
    one under the new may briefly overlap; each job is still its own idempotent transaction)."""
    return f"gpufleet:analysis:shard:{n}:{shard}"


def progress_lock_key(shard: int, n: int) -> str:
    """The Redis lock of one shard's progress pass (``analysis.tasks.analyze_progress_shard``):
    apart from the shard's hardware lock, so either runs while the other is slow."""
    return f"gpufleet:analysis:progress:{n}:{shard}"


__all__ = ["jump_hash", "partition", "progress_lock_key", "shard_lock_key", "shard_of", "stable_key"]
