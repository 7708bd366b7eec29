"""Per-request cost of the layers issue 18 put in front of every request (``BodyTimeout`` read
timeouts and the ``WebGuard`` Host/Origin/identity checks) on the ingest path: a bearer POST
with an agent's usual headers, through the layers and, side by side in the same run, straight to
the same trivial ASGI app. Reports microseconds per request and the ratio.

    .venv/bin/python bench/reliability/guard_overhead.py [--requests 50000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from gpufleet.api.auth.config import WebAuthConfig
from gpufleet.api.auth.middleware import WebGuard
from gpufleet.api.http_timeouts import BodyTimeout, ReadTimeouts

HEADERS = [(b"host", b"collector.example:8000"), (b"authorization", b"Bearer gpf_x"),
           (b"content-type", b"application/msgpack"), (b"content-encoding", b"zstd"),
           (b"content-length", b"5000"), (b"user-agent", b"python-httpx/0.28"), (b"accept", b"*/*")]


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b""})


class _State:
    pass


async def per_request_us(a: Any, n: int) -> float:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"x" * 5000, "more_body": False}

    async def send(_: dict[str, Any]) -> None:
        pass

    t = time.perf_counter()
    for _ in range(n):
        await a({"type": "http", "method": "POST", "path": "/api/v1/ingest", "headers": HEADERS}, receive, send)
    return (time.perf_counter() - t) / n * 1e6


async def main(n: int, rounds: int) -> None:
    guarded = BodyTimeout(WebGuard(app, state_app=_State(), config=WebAuthConfig()), ReadTimeouts())
    bare, layered = [], []
    for _ in range(rounds):  # interleaved, so machine noise hits both alike
        bare.append(await per_request_us(app, n))
        layered.append(await per_request_us(guarded, n))
    b, g = statistics.median(bare), statistics.median(layered)
    print(f"bare app {b:.2f} us/request, with BodyTimeout+WebGuard {g:.2f} us/request: +{g - b:.2f} us "
          f"({g / b:.1f}x of a do-nothing app)")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, default=50_000)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    asyncio.run(main(a.requests, a.rounds))
