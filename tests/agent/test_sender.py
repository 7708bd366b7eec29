"""Delivery policy against a real (scripted) HTTP server: 200, permanent 4xx, auth, throttling,
server errors and connection failures."""

from __future__ import annotations

import email.utils
import json
import logging
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gpufleet.agent.sender import Backoff, Outcome, Sender, parse_retry_after
from gpufleet.agent.spool import Spool


class Scripted:
    """An HTTP server answering POSTs from a script of (status, headers, body) and recording requests."""

    def __init__(self) -> None:
        self.script: list[tuple[int, dict[str, str], dict[str, object]]] = []
        self.requests: list[tuple[float, dict[str, str], bytes]] = []
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                outer.requests.append((time.monotonic(), dict(self.headers), body))
                status, headers, payload = outer.script.pop(0) if outer.script else (200, {}, {"stored": 1})
                data = json.dumps(payload).encode()
                if "Date" in headers:
                    self.send_response_only(status)  # no automatic Date: the script's stands alone
                else:
                    self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}"
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[Scripted]:
    s = Scripted()
    yield s
    s.close()


def _sender(tmp_path: Path, url: str, n: int = 2, **kw: object) -> Sender:
    spool = Spool(tmp_path / "spool", 10**7, fsync=False)
    for i in range(n):
        spool.put(f"body{i}".encode(), {"Content-Type": "application/msgpack", "Content-Encoding": "zstd"},
                  f"boot:{i}", rows=10)
    return Sender(spool, url, token="tok", backoff_base_s=0.5, backoff_max_s=4.0, **kw)  # type: ignore[arg-type]


def test_success_sends_oldest_first_with_token_and_encoding(tmp_path: Path, server: Scripted) -> None:
    s = _sender(tmp_path, server.url)
    assert s.send_one()[0].outcome is Outcome.SENT  # type: ignore[index]
    assert s.send_one()[0].outcome is Outcome.SENT  # type: ignore[index]
    assert s.send_one() is None
    bodies = [b for _, _, b in server.requests]
    assert bodies == [b"body0", b"body1"]
    h = server.requests[0][1]
    assert h["Authorization"] == "Bearer tok"
    assert h["Content-Encoding"] == "zstd" and h["Content-Type"] == "application/msgpack"
    assert h["Idempotency-Key"] == "boot:0"


@pytest.mark.parametrize("status", [400, 413, 415, 422])
def test_permanent_rejection_is_dead_lettered_with_reason(tmp_path: Path, server: Scripted, status: int) -> None:
    server.script = [(status, {}, {"detail": f"bad batch ({status})"})]
    s = _sender(tmp_path, server.url)
    r, delay = s.send_one()  # type: ignore[misc]
    assert r.outcome is Outcome.DEAD and delay == 0
    reasons = (tmp_path / "spool" / "dead" / "reasons.jsonl").read_text()
    assert f"bad batch ({status})" in reasons and '"key": "boot:0"' in reasons
    # the next batch is not held up by the bad one
    assert s.send_one()[0].outcome is Outcome.SENT  # type: ignore[index]
    assert len(s.spool) == 0


@pytest.mark.parametrize("status", [401, 403, 409])
def test_auth_failure_keeps_the_batch_and_logs(tmp_path: Path, server: Scripted, status: int,
                                               caplog: pytest.LogCaptureFixture) -> None:
    server.script = [(status, {}, {"detail": "token revoked"})] * 2
    s = _sender(tmp_path, server.url)
    with caplog.at_level(logging.ERROR):
        r, delay = s.send_one()  # type: ignore[misc]
    assert r.outcome is Outcome.AUTH and delay > 0
    assert "token revoked" in caplog.text
    assert ("--node" if status == 409 else "GPUFLEET_AGENT_TOKEN") in caplog.text
    assert len(s.spool) == 2 and not (tmp_path / "spool" / "dead").exists()


def test_retry_after_is_honoured_and_capped(tmp_path: Path, server: Scripted) -> None:
    server.script = [(429, {"Retry-After": "7"}, {"detail": "slow down"}),
                     (503, {"Retry-After": "100000"}, {"detail": "overloaded"}),
                     (503, {}, {"detail": "overloaded"})]
    s = _sender(tmp_path, server.url, retry_after_max_s=60.0)
    assert s.send_one()[1] == 7.0  # type: ignore[index]
    assert s.send_one()[1] == 60.0  # type: ignore[index]
    r, delay = s.send_one()  # type: ignore[misc]
    assert r.outcome is Outcome.THROTTLED and 0.25 <= delay <= 0.5  # no header: backoff
    assert [b for _, _, b in server.requests] == [b"body0"] * 3, "the same batch is retried"


def test_server_errors_and_outages_back_off_exponentially(tmp_path: Path, server: Scripted) -> None:
    server.script = [(500, {}, {"detail": "boom"}), (502, {}, {}), (500, {}, {})]
    s = _sender(tmp_path, server.url)
    delays = [s.send_one()[1] for _ in range(3)]  # type: ignore[index]
    assert 0.25 <= delays[0] <= 0.5 and 0.5 <= delays[1] <= 1.0 and 1.0 <= delays[2] <= 2.0
    assert s.send_one()[0].outcome is Outcome.SENT  # type: ignore[index]
    assert s.backoff.attempt == 0, "success resets the backoff"
    down = _sender(tmp_path / "x", "http://127.0.0.1:9")  # nothing listens on the discard port
    r, delay = down.send_one()  # type: ignore[misc]
    assert r.outcome is Outcome.FAILED and "Connect" in r.detail and delay > 0
    assert len(down.spool) == 2


def test_backoff_has_full_jitter_and_a_cap() -> None:
    import random

    b = Backoff(1.0, 8.0, random.Random(1))
    seen = [b.next() for _ in range(10)]
    assert all(0.5 <= d <= 1.0 for d in seen[:1]) and all(4.0 <= d <= 8.0 for d in seen[4:])
    assert len(set(seen)) == len(seen), "jittered"


def test_parse_retry_after() -> None:
    now = time.time()
    assert parse_retry_after("12", now) == 12.0
    assert parse_retry_after(None, now) is None and parse_retry_after("soon", now) is None
    when = email.utils.formatdate(now + 30, usegmt=True)
    assert 28 <= parse_retry_after(when, now) <= 31  # type: ignore[operator]


def test_agent_loop_waits_as_told(tmp_path: Path, server: Scripted) -> None:
    server.script = [(429, {"Retry-After": "1"}, {"detail": "busy"})]
    s = _sender(tmp_path, server.url, n=1)
    stop = threading.Event()
    t = threading.Thread(target=s.run, args=(stop,))
    t.start()
    deadline = time.monotonic() + 10
    while len(server.requests) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    stop.set()
    s.wake.set()
    t.join(5)
    assert len(server.requests) == 2
    gap = server.requests[1][0] - server.requests[0][0]
    assert gap >= 0.95, f"retried after {gap:.2f} s, Retry-After said 1"
    assert len(s.spool) == 0


def test_clock_skew_from_the_date_header_is_reported(tmp_path: Path, server: Scripted,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    from gpufleet.agent.metrics import AgentMetrics

    server.script = [(200, {"Date": email.utils.formatdate(time.time() - 600, usegmt=True)}, {"stored": 1})]
    m = AgentMetrics("n")
    s = _sender(tmp_path, server.url, n=1, metrics=m)
    with caplog.at_level(logging.WARNING):
        s.send_one()
    skew = m.registry.get_sample_value("gpufleet_agent_clock_skew_seconds")
    assert skew is not None and 595 <= skew <= 605
    assert "clock is +" in caplog.text and "NTP" in caplog.text
