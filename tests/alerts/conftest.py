"""Alerts fixtures: a real HTTP server standing in for Slack's webhook endpoint, and helpers
that insert jobs/flags/reports rows directly (the goodput engine's output contract)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


@dataclass
class Post:
    ts: float
    path: str
    body: dict[str, Any]
    status: int  # what we answered; 0 = we never answered (timeout)


@dataclass
class FakeSlack:
    """Records every POST. ``script`` is consumed one entry per request: an int status
    (``429`` answers ``Retry-After: retry_after``), or ``"timeout"`` (hold the request longer
    than the client waits, then drop it unanswered). Empty script: 200 ``ok``."""

    url: str = ""
    script: list[Any] = field(default_factory=list)
    retry_after: str = "1"
    hang_s: float = 1.5
    posts: list[Post] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def delivered(self) -> list[Post]:
        """Posts Slack accepted (answered 2xx): what a channel would show."""
        with self.lock:
            return [p for p in self.posts if 200 <= p.status < 300]

    def wait_delivered(self, n: int, timeout: float = 20.0) -> list[Post]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            d = self.delivered()
            if len(d) >= n:
                return d
            time.sleep(0.05)
        return self.delivered()


def _handler(fake: FakeSlack) -> type[BaseHTTPRequestHandler]:
    class H(BaseHTTPRequestHandler):
        def log_message(self, *a: object) -> None:
            pass

        def do_POST(self) -> None:
            n = int(self.headers.get("Content-Length", "0"))
            raw = self.rfile.read(n)
            try:
                body = json.loads(raw)
            except ValueError:
                body = {"_raw": raw.decode("utf-8", "replace")}
            with fake.lock:
                action = fake.script.pop(0) if fake.script else 200
            if action == "timeout":
                with fake.lock:
                    fake.posts.append(Post(time.time(), self.path, body, 0))
                time.sleep(fake.hang_s)
                self.close_connection = True
                return  # no answer at all
            status = int(action)
            with fake.lock:
                fake.posts.append(Post(time.time(), self.path, body, status))
            text = {200: b"ok", 429: b"rate_limited", 400: b"invalid_payload", 404: b"no_service"}.get(
                status, b"server_error")
            self.send_response(status)
            if status == 429:
                self.send_header("Retry-After", fake.retry_after)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)

    return H


@pytest.fixture
def fake_slack() -> Iterator[FakeSlack]:
    fake = FakeSlack()
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
    srv.daemon_threads = True
    fake.url = f"http://127.0.0.1:{srv.server_address[1]}/services/T000/B000/XXXX"
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    yield fake
    srv.shutdown()
    srv.server_close()
