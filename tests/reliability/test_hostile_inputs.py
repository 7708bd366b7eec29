"""Hostile input into every parameter the schemathesis run (tests/api/test_fuzz.py, GET reads)
leaves out: alert and silence operations, sign-in, token management, and the NDJSON import, over real HTTP on
SQLite and PostgreSQL (which refuses NUL in text). Every case gets an answer below 500, a
refused write stores nothing, and an accepted one stores exactly what it said."""

from __future__ import annotations

import gzip
import json
from urllib.parse import quote

import httpx
import pytest
import sqlalchemy as sa

from gpufleet.storage.raw_read import count_raw_samples

HOSTILE: list[object] = [
    "\x00", "a\x00b", "' OR 1=1 --", "<script>alert(1)</script>", "x" * 10_000, "\ud800", "-1", "1e309", "NaN",
    "../../etc/passwd", "%00", "\U0001F600" * 100, "", " ", "\n", "\r\nX-Injected: 1", "9" * 400, -1, 0, 1e309,
    2**70, True, None, [], {}, {"$ne": 1}, [1, [2, [3]]],
]


def _counts(url: str) -> tuple[int, int, int]:
    e = sa.create_engine(url)
    try:
        with e.connect() as c:
            silences, jobs = (int(c.execute(sa.text(f"select count(*) from {t}")).scalar_one())
                              for t in ("alert_silences", "jobs"))
            return silences, jobs, count_raw_samples(c)
    finally:
        e.dispose()


def _json(value: object) -> str:
    return json.dumps(value, allow_nan=True, ensure_ascii=True)


def test_alert_and_auth_parameters(database_url: str, live_server) -> None:  # type: ignore[no-untyped-def]
    srv = live_server(database_url, allow_anonymous=True)
    base_silence = {"job": "4242", "reason": "maintenance", "expires_in": "1h"}
    cases = 0
    failures: list[str] = []
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        def check(r: httpx.Response, what: str) -> None:
            nonlocal cases
            cases += 1
            if r.status_code >= 500:
                failures.append(f"{what}: {r.status_code} {r.text[:200]}")

        for v in HOSTILE:
            s = v if isinstance(v, str) else _json(v)
            # a lone surrogate cannot travel in a URL: send its raw bytes, as a client would
            s = s.encode("utf-8", "surrogatepass").decode("latin-1") if "\ud800" in s else s
            check(c.get("/api/v1/alerts", params={"state": s}), f"GET alerts state={s[:40]!r}")
            check(c.get("/api/v1/alerts/silences", params={"include_expired": s}), f"GET silences {s[:40]!r}")
            check(c.get("/api/v1/alerts/outbox", params={"state": s}), f"GET outbox {s[:40]!r}")
            check(c.delete(f"/api/v1/alerts/silences/{quote(s, safe='') or 'x'}"),
                  f"DELETE silence {s[:40]!r}")
            check(c.get("/signin", params={"next": s}), f"GET /signin next={s[:40]!r}")
            check(c.post("/api/v1/auth/signin", content=_json({"token": v}),
                         headers={"Content-Type": "application/json"}), f"signin token={s[:40]!r}")
            for field in ("name", "role", "cluster", "node"):
                tok = {"name": "hostile-probe", "role": "viewer", field: v}
                check(c.post("/api/v1/tokens", content=_json(tok), headers={"Content-Type": "application/json"}),
                      f"POST token {field}={s[:40]!r}")
                c.delete("/api/v1/tokens/hostile-probe")
            check(c.delete(f"/api/v1/tokens/{quote(s, safe='') or 'x'}"), f"DELETE token {s[:40]!r}")
            for field in ("job", "user", "flag", "cluster", "expires_in", "reason"):
                before = _counts(database_url)[0]
                r = c.post("/api/v1/alerts/silences", content=_json({**base_silence, field: v}),
                           headers={"Content-Type": "application/json"})
                check(r, f"POST silence {field}={s[:40]!r}")
                after = _counts(database_url)[0]
                if r.status_code == 201:
                    stored = r.json()
                    if after != before + 1:
                        failures.append(f"silence {field}={s[:40]!r}: 201 but {after - before} rows")
                    elif field in ("job", "user", "cluster") and isinstance(v, str) and v.strip() and \
                            stored.get(field) != v:
                        failures.append(f"silence {field}: stored {stored.get(field)!r}, sent {v[:40]!r}")
                elif after != before:
                    failures.append(f"silence {field}={s[:40]!r}: refused ({r.status_code}) yet stored")
        # the page shell escapes what it echoes: no markup from ?next= reaches the HTML
        page = c.get("/signin", params={"next": "/\"><script>alert(1)</script>"}).text
        assert "<script>alert(1)</script>" not in page
    print(f"HOSTILE alerts+auth: {cases} cases, {len(failures)} failures")  # docs/reliability.md
    assert not failures, "\n".join(failures[:30])


def _import(c: httpx.Client, body: bytes) -> httpx.Response:
    return c.post("/api/v1/import", content=gzip.compress(body),
                  headers={"Content-Type": "application/x-ndjson", "Content-Encoding": "gzip"})


@pytest.mark.slow
def test_import_hostile_lines_store_nothing(database_url: str, live_server) -> None:  # type: ignore[no-untyped-def]
    srv = live_server(database_url, allow_anonymous=True)
    good_job = {"type": "job", "job_id": "imp-1", "user": "alice"}
    templates: list[dict[str, object]] = [
        {"type": "job", "job_id": None}, {"type": "job", "user": None},
        {"type": "sample", "ts": None, "gpu": "GPU-x"}, {"type": "sample", "ts": 1.7e9, "gpu": None},
        {"type": "sample", "ts": 1.7e9, "gpu": "GPU-x", "sm_active": None},
        {"type": None},
    ]
    cases = 0
    failures: list[str] = []
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        for t in templates:
            for key in [k for k, v in t.items() if v is None]:
                for v in HOSTILE:
                    line = _json({**t, key: v})
                    before = _counts(database_url)
                    r = _import(c, (_json(good_job) + "\n" + line + "\n").encode("utf-8", "surrogatepass"))
                    cases += 1
                    after = _counts(database_url)
                    if r.status_code >= 500:
                        failures.append(f"{key}={str(v)[:40]!r}: {r.status_code} {r.text[:200]}")
                    elif r.status_code >= 400 and after != before:
                        failures.append(f"{key}={str(v)[:40]!r}: refused ({r.status_code}) but stored {after} vs "
                                        f"{before} (all or nothing)")
        deep = "[" * 5000 + "]" * 5000
        for body in (b"\x00" * 100, b"{" * 100_000, ('{"type":"job","job_id":"x","labels":' + deep + "}").encode(),
                     b"\xff\xfe\xfd\n", b'{"type": "job", "job_id": "a"}' * 3000):
            before = _counts(database_url)
            r = _import(c, body)
            cases += 1
            if r.status_code >= 500 or (r.status_code >= 400 and _counts(database_url) != before):
                failures.append(f"body {body[:30]!r}: {r.status_code} {r.text[:200]}")
    print(f"HOSTILE import: {cases} cases, {len(failures)} failures")  # docs/reliability.md
    assert not failures, "\n".join(failures[:30])
