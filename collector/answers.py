"""What the collector's raw endpoints answer (ingest, import's streaming reader, remote write),
shared so that the Starlette endpoints and the pure-ASGI front send the same thing without a
Response class: an ``Answer`` is (status, JSON body, extra raw headers)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import msgspec

_json = msgspec.json.Encoder()

Answer = tuple[int, bytes, list[tuple[bytes, bytes]]]
# Called once, after auth: yields the request body's chunks; raises ClientDisconnect when
# the client goes away mid-body (Starlette's Request.stream contract, kept by the front).
BodyReader = Callable[[], AsyncIterator[bytes]]


def answer(status: int, detail: str, retry_after: int | None = None) -> Answer:
    extra: list[tuple[bytes, bytes]] = []
    if retry_after is not None:
        extra.append((b"retry-after", str(retry_after).encode("latin-1")))
    if status == 401:
        extra.append((b"www-authenticate", b"Bearer"))
    return status, _json.encode({"detail": detail}), extra


async def read_limited_body(read_body: BodyReader, limit: int, content_length: str | None) -> bytes | Answer:
    """The whole body, or a 413/400 answer. Chunked bodies have no Content-Length: the limit
    is enforced while streaming too, so an oversized body is never held whole."""
    if content_length is not None:
        try:
            if int(content_length) > limit:
                return answer(413, f"body of {content_length} bytes exceeds the limit of {limit} "
                                   "(GPUFLEET_MAX_BODY_BYTES)")
        except ValueError:
            return answer(400, "invalid Content-Length")
    chunks = []
    size = 0
    async for chunk in read_body():
        size += len(chunk)
        if size > limit:
            return answer(413, f"body exceeds the limit of {limit} bytes (GPUFLEET_MAX_BODY_BYTES)")
        chunks.append(chunk)
    return b"".join(chunks)
