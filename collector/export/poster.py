"""One keep-alive HTTP/1.1 connection to the remote-write receiver, on a plain socket.

The sender posts a few bodies a second from its own thread, beside the ingest event loop on the
same GIL. httpx spent ~0.7 ms of CPU per 180 KB body; the stdlib's http.client ~0.15 ms alone
but ~0.6 ms in a loaded collector (bench/remote_write/export_cost.py: the sender thread's CPU),
where each of its many small steps (a request line, each header, the body copied onto the
headers, a new buffered reader and an email-parser pass per response) is Python work that
waits for the GIL again after every system call. Here a request is one ``sendmsg`` of the
prebuilt head and the body (no copy), and an answer one ``recv`` in the usual case: a
receiver's 204 or 200 with a short body is a few hundred bytes.

What it reads: a status line, headers, and a body delimited by Content-Length, chunked
transfer coding, or (no length) the connection's close; 1xx interim answers are skipped; 204,
304 and HEAD-less 1xx carry no body. It keeps the connection unless the receiver says
``Connection: close``, speaks HTTP/1.0 without keep-alive, or delimits the body by closing.
Every failure is an OSError or an http.client.HTTPException, as with http.client, and the
connection is then closed (the next post opens a new one)."""

from __future__ import annotations

import http.client
import socket
import ssl
from dataclasses import dataclass
from urllib.parse import urlsplit

_MAX_HEAD = 64 * 1024  # an answer's status line and headers; more is not a receiver's answer
_MAX_BODY = 1 << 20  # an answer's body read (kept: its first 300 bytes, for the log)


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    retry_after: str | None
    text: str

    @property
    def is_success(self) -> bool:
        return 200 <= self.status < 300


class _Conn:
    """A connected socket and what was read past the last answer."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def _more(self) -> bytes:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise http.client.IncompleteRead(self.buf)
        return chunk

    def head(self) -> bytes:
        """The status line and headers, up to the blank line (without it)."""
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end >= 0:
                out, self.buf = self.buf[:end], self.buf[end + 4:]
                return out
            if len(self.buf) > _MAX_HEAD:
                raise http.client.LineTooLong("answer headers")
            self.buf += self._more()

    def exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            self.buf += self._more()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def line(self) -> bytes:
        while (end := self.buf.find(b"\r\n")) < 0:
            if len(self.buf) > _MAX_HEAD:
                raise http.client.LineTooLong("chunk size")
            self.buf += self._more()
        out, self.buf = self.buf[:end], self.buf[end + 2:]
        return out

    def chunked(self) -> bytes:
        out = bytearray()
        while True:
            size_s = self.line().split(b";", 1)[0].strip()
            try:
                size = int(size_s, 16)
            except ValueError:
                raise http.client.HTTPException(f"bad chunk size {size_s[:20]!r}") from None
            if size == 0:
                while self.line():  # trailers, up to the blank line
                    pass
                return bytes(out)
            data = self.exactly(size + 2)
            if len(out) < _MAX_BODY:
                out += data[:size]

    def until_close(self) -> bytes:
        out = bytearray(self.buf)
        self.buf = b""
        while len(out) < _MAX_BODY and (chunk := self.sock.recv(65536)):
            out += chunk
        return bytes(out)


def _parse_head(head: bytes) -> tuple[bytes, int, dict[bytes, bytes]]:
    """(version, status, headers by lower-case name) of an answer's head."""
    status_line, _, rest = head.partition(b"\r\n")
    parts = status_line.split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit() or len(parts[1]) != 3:
        raise http.client.BadStatusLine(status_line[:100].decode("latin-1"))
    hdrs: dict[bytes, bytes] = {}
    for h in rest.split(b"\r\n") if rest else ():
        k, sep, v = h.partition(b":")
        if not sep:
            raise http.client.HTTPException(f"bad answer header {h[:100]!r}")
        name = k.strip().lower()
        hdrs[name] = hdrs[name] + b", " + v.strip() if name in hdrs else v.strip()
    return parts[0], int(parts[1]), hdrs


class Poster:
    def __init__(self, url: str, timeout_s: float) -> None:
        u = urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"export URL {url!r}: want http://host[:port]/path or https://...")
        self.url = url
        self._https = u.scheme == "https"
        self._host = u.hostname
        self._port = u.port or (443 if self._https else 80)
        path = (u.path or "/") + (f"?{u.query}" if u.query else "")
        host = f"[{self._host}]" if ":" in self._host else self._host
        if u.port:
            host += f":{u.port}"
        self._start = f"POST {path} HTTP/1.1\r\nHost: {host}\r\n".encode("latin-1")
        self._timeout = timeout_s
        self._ssl = ssl.create_default_context() if self._https else None
        self._conn: _Conn | None = None
        self._heads: tuple[dict[str, str], bytes] | None = None  # the last headers, encoded

    def _connect(self) -> _Conn:
        sock = socket.create_connection((self._host, self._port), self._timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # a head and a body, no Nagle wait
            if self._ssl is not None:
                sock = self._ssl.wrap_socket(sock, server_hostname=self._host)
        except BaseException:
            sock.close()
            raise
        return _Conn(sock)

    def _head(self, headers: dict[str, str], length: int) -> bytes:
        if self._heads is None or self._heads[0] != headers:
            lines = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
            self._heads = (dict(headers), lines.encode("latin-1"))
        return b"%sContent-Length: %d\r\n%s\r\n" % (self._start, length, self._heads[1])

    def post(self, body: bytes, headers: dict[str, str]) -> Answer:
        """The receiver's answer; OSError or http.client.HTTPException when there is none
        (the connection is then closed: the next post opens a new one). A kept-alive
        connection the receiver closed while idle is retried once on a new one at once."""
        reused = self._conn is not None
        try:
            return self._post(body, headers)
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
            if not reused:
                raise
            return self._post(body, headers)

    def _post(self, body: bytes, headers: dict[str, str]) -> Answer:
        conn = self._conn or self._connect()
        self._conn = None
        try:
            ans, keep = self._exchange(conn, self._head(headers, len(body)), body)
        except BaseException:
            conn.sock.close()
            raise
        if keep:
            self._conn = conn
        else:
            conn.sock.close()
        return ans

    @staticmethod
    def _send(sock: socket.socket, head: bytes, body: bytes) -> None:
        if isinstance(sock, ssl.SSLSocket):  # no sendmsg on TLS: two writes (TCP_NODELAY: no wait)
            sock.sendall(head)
            sock.sendall(body)
            return
        sent = sock.sendmsg([head, body])
        if sent < len(head):
            sock.sendall(head[sent:])
            sent = len(head)
        if sent - len(head) < len(body):
            sock.sendall(memoryview(body)[sent - len(head):])

    def _exchange(self, conn: _Conn, head: bytes, body: bytes) -> tuple[Answer, bool]:
        self._send(conn.sock, head, body)
        first = True
        while True:
            try:
                raw = conn.head()
            except http.client.IncompleteRead:
                if first and not conn.buf:  # closed before any answer: the kept-alive case
                    raise http.client.RemoteDisconnected("closed without an answer") from None
                raise
            first = False
            version, status, hdrs = _parse_head(raw)
            if 100 <= status < 200:  # interim (100 Continue, 103 Early Hints): the answer follows
                continue
            break
        keep = version == b"HTTP/1.1" or b"keep-alive" in hdrs.get(b"connection", b"").lower()
        if b"close" in hdrs.get(b"connection", b"").lower():
            keep = False
        if status in (204, 304):
            data = b""
        elif b"chunked" in hdrs.get(b"transfer-encoding", b"").lower():
            data = conn.chunked()
        elif (cl := hdrs.get(b"content-length")) is not None:
            try:
                n = int(cl)
            except ValueError:
                raise http.client.HTTPException(f"bad Content-Length {cl[:20]!r}") from None
            if n < 0:
                raise http.client.HTTPException(f"bad Content-Length {n}")
            if n > _MAX_BODY:  # an answer that long is not one to keep the connection for
                data, keep = conn.exactly(_MAX_BODY), False
            else:
                data = conn.exactly(n)
        else:
            data, keep = conn.until_close(), False
        retry = hdrs.get(b"retry-after")
        return Answer(status, retry.decode("latin-1") if retry is not None else None,
                      data[:300].decode("utf-8", "replace")), keep

    def close(self) -> None:
        if self._conn is not None:
            self._conn.sock.close()
            self._conn = None
