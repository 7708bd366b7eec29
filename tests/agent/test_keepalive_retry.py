"""A kept-alive connection that the server closes as the agent reuses it is not an outage: the
sender retries once on a fresh connection, quietly, and delivers the batch once. Two drops in
a row are a real failure: the batch stays spooled and the warning is logged. A real socket
server that closes connections without answering, real httpx."""

from __future__ import annotations

import logging
import socket
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet.agent.sender import Outcome, Sender
from gpufleet.agent.spool import Spool
from tests.agent.conftest import read_http_message

BODY = b'{"stored": 10, "duplicate": false}'
OK = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
      b"Content-Length: %d\r\n\r\n%s" % (len(BODY), BODY))


class Dropper:
    """Accepts connections; the first ``drops`` of them are closed after the request arrives,
    without a response (what a server does to an idle keep-alive connection); later ones get 200.
    ``reset`` closes them with an RST instead (SO_LINGER 0), what a server that closes with our
    body still unread in its socket sends: the client sees ECONNRESET, not a clean close."""

    def __init__(self, drops: int, reset: bool = False) -> None:
        self.drops = drops
        self.reset = reset
        self.requests: list[bytes] = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                # The whole request, body included, so a plain close is a clean FIN every
                # time; closing with bytes unread would make the kernel send an RST instead.
                data = read_http_message(conn) or b""
                self.requests.append(data)
                if len(self.requests) > self.drops:
                    conn.sendall(OK)
                elif self.reset:
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def dropper(request: pytest.FixtureRequest) -> Iterator[Dropper]:
    drops, reset = request.param if isinstance(request.param, tuple) else (request.param, False)
    d = Dropper(drops, reset)
    yield d
    d.close()


def _sender(tmp_path: Path, url: str) -> Sender:
    spool = Spool(tmp_path / "spool", 10**7, fsync=False)
    spool.put(b"body0", {"Content-Type": "application/msgpack", "Content-Encoding": "zstd"}, "boot:0", rows=10)
    return Sender(spool, url, token="tok", backoff_base_s=0.5, backoff_max_s=4.0)


@pytest.mark.parametrize("dropper", [1, (1, True)], indirect=True, ids=["closed", "reset"])
def test_one_dropped_connection_is_retried_quietly(tmp_path: Path, dropper: Dropper,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    s = _sender(tmp_path, dropper.url)
    with caplog.at_level(logging.INFO, logger="gpufleet"):
        r = s.send_one()
    assert r is not None and r[0].outcome is Outcome.SENT and r[0].stored == 10
    assert len(dropper.requests) == 2  # the drop, then the retry
    keys = [line for req in dropper.requests for line in req.split(b"\r\n")
            if line.lower().startswith(b"idempotency-key")]
    assert len(keys) == 2 and keys[0] == keys[1]  # the same batch identity both times
    assert len(s.spool) == 0
    assert not [rec for rec in caplog.records if "unavailable" in rec.getMessage()]
    s.close()


@pytest.mark.parametrize("dropper", [2], indirect=True)
def test_two_drops_in_a_row_are_an_outage_and_keep_the_batch(tmp_path: Path, dropper: Dropper,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    s = _sender(tmp_path, dropper.url)
    with caplog.at_level(logging.WARNING):
        r = s.send_one()
    assert r is not None and r[0].outcome is Outcome.FAILED
    assert "RemoteProtocolError" in (r[0].detail or "")
    assert len(dropper.requests) == 2  # retried once, not forever
    assert len(s.spool) == 1  # nothing lost
    assert [rec for rec in caplog.records if "unavailable" in rec.getMessage()]
    r = s.send_one()  # the collector answers again: delivered once
    assert r is not None and r[0].outcome is Outcome.SENT and len(s.spool) == 0
    s.close()
