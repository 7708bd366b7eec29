"""Per-webhook token buckets: Slack allows 1 message per second per webhook with short bursts.

``acquire(key)`` takes a token and returns 0, or returns how long to wait without taking one.
``block(key, seconds)`` honours a 429's ``Retry-After`` for every sender of that webhook.
In-process for ``gpufleet up``; in Redis (one Lua script, Redis's clock) when Celery workers
on several machines share a webhook."""

from __future__ import annotations

import hashlib
import threading
import time
from typing import Protocol


def bucket_key(webhook_url: str) -> str:
    # Never put the secret webhook URL itself into Redis keys or logs.
    return "gpufleet:slack-rate:" + hashlib.sha256(webhook_url.encode()).hexdigest()[:24]


class Limiter(Protocol):
    def acquire(self, key: str) -> float: ...
    def block(self, key: str, seconds: float) -> None: ...


class MemoryLimiter:
    def __init__(self, rate_per_s: float, burst: int, clock: object = time.monotonic) -> None:
        self.rate = rate_per_s
        self.burst = float(burst)
        self.clock = clock
        self._lock = threading.Lock()
        self._state: dict[str, tuple[float, float, float]] = {}  # tokens, ts, blocked_until

    def acquire(self, key: str) -> float:
        with self._lock:
            now = self.clock()  # type: ignore[operator]
            tokens, ts, blocked = self._state.get(key, (self.burst, now, 0.0))
            if blocked > now:
                return blocked - now
            tokens = min(self.burst, tokens + (now - ts) * self.rate)
            if tokens >= 1.0:
                self._state[key] = (tokens - 1.0, now, 0.0)
                return 0.0
            self._state[key] = (tokens, now, 0.0)
            return (1.0 - tokens) / self.rate

    def block(self, key: str, seconds: float) -> None:
        with self._lock:
            now = self.clock()  # type: ignore[operator]
            blocked = self._state.get(key, (self.burst, now, 0.0))[2]
            # after a 429 the bucket starts empty: resume at the permitted pace, not in a burst
            self._state[key] = (0.0, now + seconds, max(blocked, now + seconds))


_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local rate = tonumber(ARGV[1]); local burst = tonumber(ARGV[2]); local block = tonumber(ARGV[3])
local h = redis.call('HMGET', KEYS[1], 'tokens', 'ts', 'blocked')
local tokens = tonumber(h[1]) or burst
local ts = tonumber(h[2]) or now
local blocked = tonumber(h[3]) or 0
local wait = 0
if block > 0 then
  blocked = math.max(blocked, now + block); tokens = 0; ts = now + block
elseif blocked > now then
  wait = blocked - now
else
  tokens = math.min(burst, tokens + math.max(0, now - ts) * rate); ts = now
  if tokens >= 1 then tokens = tokens - 1 else wait = (1 - tokens) / rate end
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', tostring(ts), 'blocked', tostring(blocked))
redis.call('EXPIRE', KEYS[1], 3600)
return tostring(wait)
"""


class RedisLimiter:
    def __init__(self, redis_url: str, rate_per_s: float, burst: int) -> None:
        import redis

        self.r = redis.Redis.from_url(redis_url, socket_timeout=5)
        self.rate = rate_per_s
        self.burst = burst
        self._script = self.r.register_script(_LUA)

    def acquire(self, key: str) -> float:
        return float(self._script(keys=[key], args=[self.rate, self.burst, 0]))

    def block(self, key: str, seconds: float) -> None:
        self._script(keys=[key], args=[self.rate, self.burst, max(0.001, seconds)])
