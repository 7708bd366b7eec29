"""Wrong sign-ins throttled per source: at most ``max_failures`` in any ``window_s`` seconds
from one client address; past that every sign-in from it (a right token too, else the answer
would tell a guesser when it hit) is answered 429 with Retry-After until the oldest failure
leaves the window. In memory, per process (``serve --workers N`` allows N times as many);
bounded: the least recently failing sources are forgotten past ``max_sources``."""

from __future__ import annotations

import ipaddress
import math
import threading
from collections import OrderedDict, deque

from .config import WebAuthConfig
from .identity import from_trusted_proxy


class SignInThrottle:
    def __init__(self, max_failures: int, window_s: float, max_sources: int = 10_000) -> None:
        self.max_failures = max_failures
        self.window_s = window_s
        self.max_sources = max_sources
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()
        self._lock = threading.Lock()

    def retry_after(self, source: str, now: float) -> int | None:
        """Seconds until ``source`` may try again, or None when it may now."""
        with self._lock:
            q = self._failures.get(source)
            if q is None:
                return None
            while q and q[0] <= now - self.window_s:
                q.popleft()
            if len(q) < self.max_failures:
                return None
            return max(1, math.ceil(q[0] + self.window_s - now))

    def failed(self, source: str, now: float) -> None:
        with self._lock:
            q = self._failures.pop(source, None)
            if q is None:
                q = deque(maxlen=self.max_failures)
            q.append(now)
            self._failures[source] = q  # most recent last
            while len(self._failures) > self.max_sources:
                self._failures.popitem(last=False)

    def succeeded(self, source: str) -> None:
        with self._lock:
            self._failures.pop(source, None)


def client_source(client_ip: str | None, forwarded_for: str | None, cfg: WebAuthConfig) -> str:
    """The address a sign-in comes from: the TCP peer, or behind a trusted proxy the nearest
    X-Forwarded-For hop that is not itself a trusted proxy (hops further left are whatever the
    client wrote, so they are not believed)."""
    peer = client_ip or "unknown"
    if not forwarded_for or not from_trusted_proxy(client_ip, cfg):
        return peer
    for hop in reversed([h.strip() for h in forwarded_for.split(",") if h.strip()]):
        try:
            ipaddress.ip_address(hop)
        except ValueError:
            return peer  # a malformed chain: throttle the proxy's address, not a made-up one
        if not from_trusted_proxy(hop, cfg):
            return hop
    return peer
