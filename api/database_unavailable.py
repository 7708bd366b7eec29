"""A JSON 503 + Retry-After for any request whose database work fails because the database
cannot be reached (down, restarting, failing over), instead of a plain-text 500 with a
traceback per request. Logged as one line at most every 10 s per process. Other database
errors stay what they are: a logged 500."""

from __future__ import annotations

import logging
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError

from gpufleet.storage.errors import is_transient, is_unreachable

log = logging.getLogger(__name__)
RETRY_AFTER_S = 5
_last_log = 0.0


async def _handler(request: Request, exc: Exception) -> JSONResponse:
    global _last_log
    assert isinstance(exc, DBAPIError)
    if not (is_transient(exc) or is_unreachable(exc)):
        log.error("database error answering %s %s", request.method, request.url.path, exc_info=exc)
        return JSONResponse({"detail": "internal error (logged on the server)"}, status_code=500)
    now = time.monotonic()
    if now - _last_log >= 10.0:
        _last_log = now
        log.warning("database unavailable (answering 503): %s", str(exc).splitlines()[0] if str(exc) else exc)
    return JSONResponse({"detail": "database unavailable, retry later"}, status_code=503,
                        headers={"Retry-After": str(RETRY_AFTER_S)})


def install(app: FastAPI) -> None:
    app.add_exception_handler(DBAPIError, _handler)
