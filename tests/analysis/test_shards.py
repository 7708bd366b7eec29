"""The shard partition (analysis/shards.py): the same in every process, balanced, consistent
when the shard count changes, and a partition (every key in exactly one shard)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest

from gpufleet.analysis.shards import jump_hash, partition, shard_lock_key, shard_of, stable_key

KEYS = list(range(1, 10_001))


def test_shard_of_is_the_same_in_processes_with_different_hash_seeds() -> None:
    # Python salts hash() of strings per process: a partition built on it would differ
    # between two workers. Ours must not.
    code = ("import json,sys; from gpufleet.analysis.shards import shard_of; "
            "print(json.dumps([shard_of(k, 8) for k in list(range(1, 300)) + ['a', 'job-7']]))")
    seen = []
    for seed in ("1", "2", "random"):
        out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": seed},
                             capture_output=True, text=True, check=True).stdout
        seen.append(json.loads(out))
    here = [shard_of(k, 8) for k in [*range(1, 300), "a", "job-7"]]
    assert seen[0] == seen[1] == seen[2] == here


@pytest.mark.parametrize("n", [1, 2, 3, 8, 64])
def test_every_key_lands_in_range_and_shards_are_balanced(n: int) -> None:
    counts = Counter(shard_of(k, n) for k in KEYS)
    assert set(counts) == set(range(n))
    mean = len(KEYS) / n
    # A hash spreads like a fair die: the largest shard within 5 binomial sigmas of the mean
    # (a skewed or constant hash is off by far more).
    sigma = (len(KEYS) * (1 / n) * (1 - 1 / n)) ** 0.5
    assert max(abs(c - mean) for c in counts.values()) <= 5 * sigma + 1


def test_keys_with_a_common_stride_still_spread() -> None:
    # Primary keys that share a factor with the shard count (every 8th id) would all land in
    # one shard under id % 8.
    counts = Counter(shard_of(k, 8) for k in range(8, 8 * 4001, 8))
    assert len(counts) == 8
    assert max(counts.values()) < 1.25 * 4000 / 8


def test_growing_the_shard_count_moves_only_the_keys_of_the_new_shard() -> None:
    for n in (2, 7, 8):
        before = {k: shard_of(k, n) for k in KEYS}
        after = {k: shard_of(k, n + 1) for k in KEYS}
        moved = [k for k in KEYS if before[k] != after[k]]
        assert all(after[k] == n for k in moved)  # moved keys go to the new shard only
        share = len(moved) / len(KEYS)
        assert abs(share - 1 / (n + 1)) < 0.03, share  # about 1/(n+1), not "almost all"


def test_partition_is_a_partition_in_input_order() -> None:
    keys = [5, 3, 99, 1, 42, 7, 1000, 2]
    parts = partition(keys, 3)
    assert len(parts) == 3
    assert sorted(k for p in parts for k in p) == sorted(keys)
    for i, p in enumerate(parts):
        assert all(shard_of(k, 3) == i for k in p)
        assert p == [k for k in keys if k in p]  # the order the keys came in
    assert partition([], 4) == [[], [], [], []]


def test_bad_shard_counts_are_refused() -> None:
    with pytest.raises(ValueError, match=">= 1"):
        shard_of(1, 0)
    with pytest.raises(ValueError, match=">= 1"):
        jump_hash(stable_key(1), -3)


def test_lock_names_differ_by_shard_and_count() -> None:
    names = {shard_lock_key(s, n) for n in (4, 8) for s in range(n)}
    assert len(names) == 12
