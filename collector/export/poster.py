"""One keep-alive HTTP connection to the remote-write receiver, on the stdlib's http.client.

The sender posts a few bodies a second; httpx spent ~0.7 ms of CPU (under the GIL, beside the
event loop) per 180 KB body where http.client spends ~0.15 ms (bench/remote_write/export_cost.py
--micro), and the export needs nothing httpx adds: one URL, one connection, no redirects."""

from __future__ import annotations

import http.client
import ssl
from dataclasses import dataclass
from urllib.parse import urlsplit


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    retry_after: str | None
    text: str

    @property
    def is_success(self) -> bool:
        return 200 <= self.status < 300


class Poster:
    def __init__(self, url: str, timeout_s: float) -> None:
        u = urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"export URL {url!r}: want http://host[:port]/path or https://...")
        self.url = url
        self._https = u.scheme == "https"
        self._host, self._port = u.hostname, u.port
        self._path = (u.path or "/") + (f"?{u.query}" if u.query else "")
        self._timeout = timeout_s
        self._conn: http.client.HTTPConnection | None = None

    def _connect(self) -> http.client.HTTPConnection:
        if self._https:
            return http.client.HTTPSConnection(self._host, self._port, timeout=self._timeout,
                                               context=ssl.create_default_context())
        return http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)

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
            conn.request("POST", self._path, body=body, headers=headers)
            r = conn.getresponse()
            data = r.read()
        except BaseException:
            conn.close()
            raise
        if r.will_close:
            conn.close()
        else:
            self._conn = conn
        return Answer(r.status, r.getheader("retry-after"), data[:300].decode("utf-8", "replace"))

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
