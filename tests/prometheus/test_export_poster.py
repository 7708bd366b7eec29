"""The export's HTTP poster (collector/export/poster.py, a plain-socket HTTP/1.1 client) against
a scripted server: what it sends, every way an answer can be delimited, when it keeps the
connection, and the errors the exporter retries on."""

from __future__ import annotations

import http.client
import socket
import threading
from collections.abc import Callable, Iterator

import pytest

from gpufleet.collector.export.poster import Poster

HEADERS = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy"}
Script = Callable[[socket.socket, bytes, bytes], bool]  # (conn, head, body) -> keep reading this connection


class Server:
    """Accepts connections and answers each request with ``script``; records every request
    (head, body) and how many connections it accepted."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.requests: list[tuple[bytes, bytes]] = []
        self.connections = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self._t = threading.Thread(target=self._accept, daemon=True)
        self._t.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        buf = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in buf:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                head, _, buf = buf.partition(b"\r\n\r\n")
                length = next(int(h.split(b":")[1]) for h in head.split(b"\r\n")
                              if h.lower().startswith(b"content-length"))
                while len(buf) < length:
                    buf += conn.recv(65536)
                body, buf = buf[:length], buf[length:]
                self.requests.append((head, body))
                if not self.script(conn, head, body):
                    return

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def serve() -> Iterator[Callable[[Script], Server]]:
    made: list[Server] = []

    def make(script: Script) -> Server:
        made.append(Server(script))
        return made[-1]

    yield make
    for s in made:
        s.close()


def answer(raw: bytes, keep: bool = True) -> Script:
    def script(conn: socket.socket, head: bytes, body: bytes) -> bool:
        conn.sendall(raw)
        return keep
    return script


def test_a_post_is_the_head_and_the_body_and_a_204_keeps_the_connection(serve) -> None:
    srv = serve(answer(b"HTTP/1.1 204 No Content\r\nDate: x\r\n\r\n"))
    p = Poster(f"http://127.0.0.1:{srv.port}/api/v1/write?tenant=a", 5)
    body = bytes(range(256)) * 1000  # larger than one segment: sent whole
    for k in range(3):
        r = p.post(body + bytes([k]), {**HEADERS, "Authorization": "Bearer t"} if k == 2 else HEADERS)
        assert r.status == 204 and r.is_success and r.retry_after is None and r.text == ""
    assert srv.connections == 1 and len(srv.requests) == 3
    head, got = srv.requests[0]
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /api/v1/write?tenant=a HTTP/1.1"
    assert {b"Host: 127.0.0.1:%d" % srv.port, b"Content-Length: %d" % (len(body) + 1),
            b"Content-Type: application/x-protobuf", b"Content-Encoding: snappy"} <= set(lines[1:])
    assert got == body + b"\x00" and srv.requests[1][1] == body + b"\x01"
    assert b"Authorization: Bearer t" in srv.requests[2][0].split(b"\r\n")  # headers changed: re-encoded
    assert b"Authorization: Bearer t" not in srv.requests[1][0]
    p.close()


@pytest.mark.parametrize(("raw", "status", "text", "retry"), [
    (b"HTTP/1.1 400 Bad Request\r\nContent-Length: 11\r\n\r\nbad samples", 400, "bad samples", None),
    (b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 7\r\nTransfer-Encoding: chunked\r\n\r\n"
     b"4\r\nbusy\r\n6;ext=1\r\n, wait\r\n0\r\nX-Trailer: 1\r\n\r\n", 503, "busy, wait", "7"),
    (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", 200, "ok", None),
])
def test_answers_delimited_by_length_or_chunks_keep_the_connection(serve, raw, status, text, retry) -> None:
    srv = serve(answer(raw))
    p = Poster(f"http://127.0.0.1:{srv.port}/w", 5)
    for _ in range(2):
        r = p.post(b"x", HEADERS)
        assert (r.status, r.text, r.retry_after) == (status, text, retry)
    assert srv.connections == 1


@pytest.mark.parametrize("raw", [
    b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 500 Oops\r\n\r\nuntil the close",  # no length: the body ends with the connection
])
def test_a_receiver_that_closes_gets_a_new_connection_per_post(serve, raw) -> None:
    srv = serve(answer(raw, keep=False))
    p = Poster(f"http://127.0.0.1:{srv.port}/w", 5)
    for _ in range(3):
        r = p.post(b"x", HEADERS)
        assert r.status in (200, 500)
        assert r.text == ("until the close" if r.status == 500 else "")
    assert srv.connections == 3


def test_a_kept_connection_closed_while_idle_is_retried_once_at_once(serve) -> None:
    answered = []

    def once_per_connection(conn: socket.socket, head: bytes, body: bytes) -> bool:
        if len(answered) == 1:  # the second request, on the kept connection: closed unanswered
            answered.append(False)
            return False
        answered.append(True)
        conn.sendall(b"HTTP/1.1 204 No Content\r\n\r\n")
        return True

    srv = serve(once_per_connection)
    p = Poster(f"http://127.0.0.1:{srv.port}/w", 5)
    assert p.post(b"a", HEADERS).status == 204
    assert p.post(b"b", HEADERS).status == 204  # retried on a new connection
    assert srv.connections == 2 and [b for _, b in srv.requests] == [b"a", b"b", b"b"]


def test_no_answer_on_a_new_connection_and_garbage_are_errors_the_exporter_retries(serve) -> None:
    srv = serve(lambda conn, head, body: False)  # read the request, close without answering
    p = Poster(f"http://127.0.0.1:{srv.port}/w", 5)
    with pytest.raises(http.client.RemoteDisconnected):
        p.post(b"x", HEADERS)
    assert srv.connections == 1  # a fresh connection is not retried
    bad = serve(answer(b"SMTP ready\r\n\r\n"))
    with pytest.raises(http.client.BadStatusLine):
        Poster(f"http://127.0.0.1:{bad.port}/w", 5).post(b"x", HEADERS)
    short = serve(answer(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nab", keep=False))
    with pytest.raises(http.client.IncompleteRead):
        Poster(f"http://127.0.0.1:{short.port}/w", 5).post(b"x", HEADERS)
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    with pytest.raises(OSError):
        Poster(f"http://127.0.0.1:{port}/w", 5).post(b"x", HEADERS)


def test_urls_it_cannot_post_to_are_refused_at_start() -> None:
    for url in ("ftp://x/w", "http:///w", "localhost:8428/api/v1/write"):
        with pytest.raises(ValueError, match="export URL"):
            Poster(url, 5)
