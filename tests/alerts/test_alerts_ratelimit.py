"""Token buckets per webhook, in memory and in a real Redis (shared by all workers)."""

from __future__ import annotations

import time

import pytest

from gpufleet.alerts.ratelimit import MemoryLimiter, RedisLimiter, bucket_key


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_memory_bucket_burst_then_rate_then_block() -> None:
    clk = Clock()
    lim = MemoryLimiter(1.0, 3, clock=clk)
    assert [lim.acquire("w") for _ in range(3)] == [0.0, 0.0, 0.0]  # burst
    assert lim.acquire("w") == pytest.approx(1.0)
    clk.t += 1.0
    assert lim.acquire("w") == 0.0
    assert lim.acquire("other") == 0.0  # buckets are per webhook
    lim.block("w", 5.0)  # a 429 with Retry-After: 5
    clk.t += 4.0
    assert lim.acquire("w") == pytest.approx(1.0)
    clk.t += 1.0
    assert lim.acquire("w") == pytest.approx(1.0)  # resumes at the rate, not in a burst
    clk.t += 1.0
    assert lim.acquire("w") == 0.0


def test_redis_bucket_is_shared_between_clients(redis_url: str) -> None:
    # The bucket runs on Redis's clock, so the waits shrink by however long this process took
    # between calls (a loaded CI box stalls for 100s of ms): each lower bound is the time
    # measured around the calls, not a fixed margin.
    key = bucket_key(f"http://hook/{time.time()}")
    a, b = RedisLimiter(redis_url, 1.0, 2), RedisLimiter(redis_url, 1.0, 2)
    t0 = time.monotonic()
    assert a.acquire(key) == 0.0 and b.acquire(key) == 0.0
    wait = a.acquire(key)
    # 1 per second: the third waits the second since the first take, less the time gone since
    assert 1.0 - (time.monotonic() - t0) - 0.005 <= wait <= 1.0 and wait > 0
    w = b.acquire(key)  # whichever client asks: the same bucket, nothing taken by the waits
    assert 1.0 - (time.monotonic() - t0) - 0.005 <= w <= wait and w > 0
    time.sleep(wait)
    assert b.acquire(key) == 0.0
    t1 = time.monotonic()
    a.block(key, 1.0)
    w = b.acquire(key)
    assert 1.0 - (time.monotonic() - t1) - 0.005 <= w <= 1.0
    assert "hook" not in key  # the secret URL never becomes a Redis key
