"""Issue 18 item 12: header and body read timeouts, over real sockets against real uvicorn.

A slowloris client (headers one byte at a time, or a body that trickles) is cut off after the
deadline; a normal client on the same server is served. The last test runs `gpufleet serve` and
`gpufleet up`'s uvicorn configuration the way production does.

No test here asserts how fast the server cuts a client off (a loaded box runs the server's timer
late): "cut off" is judged by events, e.g. closed while the client was still trickling, and
each wait for a close is bounded only to catch a server that never closes."""

from __future__ import annotations

import contextlib
import os
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn

from gpufleet.api.http_timeouts import (
    BodyTimeout,
    ReadTimeouts,
    TimedH11Protocol,
    TimedHttpToolsProtocol,
    set_header_timeout,
)

from ..agent.conftest import free_port, wait_port

REPO = Path(__file__).resolve().parents[2]
PROTOCOLS = [TimedH11Protocol] + ([TimedHttpToolsProtocol] if TimedHttpToolsProtocol is not None else [])


async def _echo(scope, receive, send):  # type: ignore[no-untyped-def]
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    body = b""
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return
        body += msg.get("body", b"")
        if not msg.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"got %d" % len(body)})


@contextlib.contextmanager
def _server(protocol: type, timeouts: ReadTimeouts) -> Iterator[int]:
    sock = socket.socket()  # bound here and handed over: no free_port() race with uvicorn's bind
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    app = BodyTimeout(_echo, timeouts)  # sets this process's header deadline too
    cfg = uvicorn.Config(app, host="127.0.0.1", port=port, http=protocol,
                         log_level="warning", lifespan="on")
    server = uvicorn.Server(cfg)
    t = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    t.start()
    try:
        wait_port(port)
        yield port
    finally:
        server.should_exit = True
        t.join(10)
        sock.close()
        set_header_timeout(ReadTimeouts().header_timeout_s)


def _closed_by_server(s: socket.socket, within: float) -> tuple[bool, bytes]:
    """Whether the server closed the socket within ``within`` s, and what it said first."""
    s.settimeout(within)
    got = b""
    try:
        while True:
            chunk = s.recv(4096)
            if not chunk:
                return True, got
            got += chunk
    except TimeoutError:
        return False, got
    except ConnectionResetError:
        return True, got


def _response(s: socket.socket) -> bytes:
    """One whole response from a kept-alive connection: its head, then the body its framing
    says (Content-Length or chunked). One recv() may return the head alone: the server writes
    head and body separately, and under load the reader runs between the two writes."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(4096)
        assert chunk, f"closed mid-response: {buf!r}"
        buf += chunk
    head, _, body = buf.partition(b"\r\n\r\n")
    fields = dict(ln.split(b":", 1) for ln in head.split(b"\r\n")[1:])
    length = {k.strip().lower(): v.strip() for k, v in fields.items()}.get(b"content-length")
    done = ((lambda b: len(b) >= int(length)) if length is not None
            else (lambda b: b.endswith(b"0\r\n\r\n")))  # chunked: up to the last chunk
    while not done(body):
        chunk = s.recv(4096)
        assert chunk, f"closed mid-body: {buf + body!r}"
        body += chunk
    return head + b"\r\n\r\n" + body


def _trickle(s: socket.socket, data: bytes, every_s: float = 0.1) -> int:
    """Sends ``data`` a byte at a time until the server answers or closes (the socket turns
    readable) or it is all sent; returns the bytes sent."""
    with contextlib.suppress(OSError):
        for n, ch in enumerate(data):
            if select.select([s], [], [], 0)[0]:
                return n
            s.send(bytes([ch]))
            time.sleep(every_s)
    return len(data)  # or the send failed: closed (the caller checks)


def _get(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        return _closed_by_server(s, 5)[1]


@pytest.mark.parametrize("protocol", PROTOCOLS, ids=lambda p: p.__name__)
def test_slow_headers_are_cut_off(protocol: type) -> None:
    with _server(protocol, ReadTimeouts(header_timeout_s=0.5)) as port:
        conns = []
        for _ in range(50):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(b"GET / HTTP/1.1\r\nHost: local")  # and never the rest
            conns.append(s)
        idle = socket.create_connection(("127.0.0.1", port), timeout=5)  # says nothing at all
        for s in conns:
            closed, said = _closed_by_server(s, 60)
            assert closed, "a connection with unfinished headers stayed open"
            assert said.startswith(b"HTTP/1.1 408")
            s.close()
        assert _closed_by_server(idle, 60)[0]
        idle.close()
        assert b"200 OK" in _get(port), "a normal client is still served"


@pytest.mark.parametrize("protocol", PROTOCOLS, ids=lambda p: p.__name__)
def test_trickling_headers_do_not_reset_the_deadline(protocol: type) -> None:
    # A byte every 0.1 s for up to 60 s: a deadline reset by each byte would never expire
    # while it trickles. Cut off mid-trickle, whenever the loaded server's timer fires.
    data = b"GET / HTTP/1.1\r\nHost: localhost\r\nX-Slow: " + b"a" * 600
    with _server(protocol, ReadTimeouts(header_timeout_s=0.8)) as port:
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        sent = _trickle(s, data)
        closed = _closed_by_server(s, 60)[0]
        s.close()
        assert closed and sent < len(data), f"still open after {sent} bytes trickled"


@pytest.mark.parametrize("protocol", PROTOCOLS, ids=lambda p: p.__name__)
def test_keep_alive_connection_gets_a_fresh_header_deadline(protocol: type) -> None:
    # 0.75 s idle before each of six requests, 4.5 s in all: a deadline counted from the
    # connection's start (3 s) would cut the fifth off; one that starts afresh with each request
    # leaves 2.25 s of slack for a stalled box each time.
    with _server(protocol, ReadTimeouts(header_timeout_s=3.0)) as port, \
            socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        for _ in range(6):  # six requests on one connection, each well within its deadline
            time.sleep(0.75)
            s.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
            s.settimeout(30)
            r = _response(s)
            assert r.startswith(b"HTTP/1.1 200 OK") and r.endswith((b"got 0", b"got 0\r\n0\r\n\r\n")), r
        assert _closed_by_server(s, 60)[0], "then idle past the deadline: closed"


def test_stalled_body_gets_408() -> None:
    t = ReadTimeouts(header_timeout_s=5, body_idle_s=0.5)
    with _server(TimedH11Protocol, t) as port:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"POST / HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1000\r\n\r\n" + b"x" * 10)
            closed, said = _closed_by_server(s, 60)
        assert closed and said.startswith(b"HTTP/1.1 408"), said
        assert b"no request body bytes" in said
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"POST / HTTP/1.1\r\nHost: localhost\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello")
            assert b"got 5" in _closed_by_server(s, 60)[1], "a body that arrives is read in full"


def test_trickling_body_under_the_minimum_rate_gets_408() -> None:
    t = ReadTimeouts(header_timeout_s=5, body_idle_s=2, body_min_rate=100, body_grace_s=0.5)
    with _server(TimedH11Protocol, t) as port:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"POST / HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100000\r\n\r\n")
            # 10 B/s, each byte well inside the idle limit, for up to 60 s: cut off mid-trickle
            sent = _trickle(s, b"x" * 600)
            closed, said = _closed_by_server(s, 60)
        assert closed and b"408" in said and b"B/s" in said and sent < 600


@pytest.mark.slow
def test_gpufleet_serve_cuts_slowloris_off(sqlite_url: str, tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "gpufleet.cli", "migrate", "--database-url", sqlite_url], check=True,
                   cwd=REPO, capture_output=True, timeout=120)
    port = free_port()
    env = {**os.environ, "GPUFLEET_HTTP_HEADER_TIMEOUT_S": "1", "GPUFLEET_HTTP_BODY_IDLE_S": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "gpufleet.cli", "serve", "--database-url", sqlite_url,
                             "--port", str(port), "--allow-anonymous"], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        wait_port(port, proc=proc)
        conns = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(200)]
        for s in conns:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-A: ")
        # The bound only catches a server that never cuts them off (header timeout 1 s).
        t0 = time.monotonic()
        still_open = sum(1 for s in conns if not _closed_by_server(s, max(0.05, 120 - (time.monotonic() - t0)))[0])
        for s in conns:
            s.close()
        assert still_open == 0, f"{still_open} of 200 slowloris connections still open after 120 s"
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"POST /api/v1/ingest HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n"
                      b"Content-Type: application/json\r\n\r\n{")
            closed, said = _closed_by_server(s, 60)
        assert closed and said.startswith(b"HTTP/1.1 408"), said
        assert said.count(b"HTTP/1.1") == 1, "one answer per request"
    finally:
        proc.terminate()
        proc.wait(15)
