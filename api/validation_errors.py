"""422 answers that cannot themselves fail. FastAPI's default echoes each offending ``input``
back, so a lone surrogate (not encodable as UTF-8) or an infinity (not JSON) in a request
turned the refusal into a 500 and a reset connection. The answer keeps where and why (``loc``,
``msg``, ``type``) and a printable, bounded rendering of the input."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

_INPUT_MAX = 200


def _safe(v: Any) -> Any:
    if isinstance(v, str):
        return v.encode("utf-8", "backslashreplace").decode("utf-8")[:_INPUT_MAX]
    if isinstance(v, bool | int) or v is None:
        return v
    if isinstance(v, float):
        return v if v == v and abs(v) != float("inf") else repr(v)
    return _safe(repr(v))


def safe_errors(errors: Any) -> list[dict[str, Any]]:
    out = []
    for e in errors:
        item = {"loc": [_safe(p) for p in e.get("loc", ())], "msg": _safe(str(e.get("msg", ""))),
                "type": _safe(str(e.get("type", "")))}
        if "input" in e:
            item["input"] = _safe(e["input"])
        out.append(item)
    return out


async def _handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return JSONResponse({"detail": safe_errors(exc.errors())}, status_code=422)


def install(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _handler)
