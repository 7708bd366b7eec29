"""Progress windows through the real collector into SQLite and PostgreSQL: stored once (a
retried batch is a duplicate), with the job created when only progress names it; a bad window
is refused naming the field and stores nothing; the client's http mode reaches it too."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from sqlalchemy import text

from gpufleet import protocol
from gpufleet.progress import Reporter
from gpufleet.protocol import AgentInfo, Batch, ProgressWindow
from gpufleet.storage.db import make_engine


def window(job: str = "train-9", rank: int = 0, start: float | None = None, **kw: object) -> ProgressWindow:
    s = start if start is not None else (time.time() // 10) * 10 - 60
    return ProgressWindow(job_id=job, rank=rank, pid=1234, start=s, end=s + 10, steps=20, first_step=1,
                          last_step=20, max_step=20, tokens=20 * 4096, productive_s=8.0,
                          spans={"data_wait": 1.5}, span_counts={"data_wait": 20}, **kw)  # type: ignore[arg-type]


def post(url: str, batch: Batch) -> httpx.Response:
    body, headers = protocol.encode(batch)
    return httpx.post(url + "/api/v1/ingest", content=body, headers=headers, timeout=30)


def count(engine: object, sql: str) -> int:
    with engine.connect() as c:  # type: ignore[attr-defined]
        return int(c.execute(text(sql)).scalar_one())


def test_windows_are_stored_once_and_name_their_job(database_url: str, live_server) -> None:  # type: ignore[no-untyped-def]
    srv = live_server(database_url)
    engine = make_engine(database_url)
    b = Batch(agent=AgentInfo(boot_id="b1", seq=0, node="n1"), progress=[window(rank=r) for r in range(4)])
    r1 = post(srv.url, b)
    r2 = post(srv.url, b)  # the acknowledgement was lost: the agent sends it again
    assert r1.status_code == 200 and r2.status_code == 200 and r2.json()["duplicate"] is True
    assert count(engine, "select count(*) from job_progress") == 4
    assert count(engine, "select count(*) from jobs where job_id = 'train-9'") == 1
    with engine.connect() as c:
        row = c.execute(text("select steps, tokens, productive_s, spans, node_id from job_progress "
                             "where rank = 2")).one()
    assert row[0] == 20 and row[1] == 81920 and row[2] == 8.0 and row[4] is not None
    assert (row[3] if isinstance(row[3], dict) else json.loads(row[3])) == {"data_wait": 1.5}
    engine.dispose()


@pytest.mark.parametrize("bad", [{"productive_s": -1.0}, {"steps": -3}, {"start": 12.0}, {"job_id": ""}])
def test_a_bad_window_is_refused_naming_it_and_the_good_one_is_stored(sqlite_url: str, live_server, bad) -> None:  # type: ignore[no-untyped-def]
    srv = live_server(sqlite_url)
    engine = make_engine(sqlite_url)
    good = window()
    doc = protocol.msgspec.to_builtins(Batch(agent=AgentInfo(boot_id="b2", seq=0, node="n1"),
                                             progress=[good, good]))
    doc["progress"][1].update(bad)
    if "start" in bad:
        doc["progress"][1]["end"] = bad["start"] + 10
    r = httpx.post(srv.url + "/api/v1/ingest", content=protocol.msgspec.json.encode(doc),
                   headers={"Content-Type": "application/json"}, timeout=30)
    # partial acceptance (collector/intake_schema.py): the bad window alone is refused, by name
    assert r.status_code == 200, r.text
    field = next(iter(bad))
    assert f"progress[1].{field}" in r.json()["refused"][0]["detail"], r.text
    assert count(engine, "select count(*) from job_progress") == 1
    engine.dispose()


def test_http_mode_without_an_agent_reaches_the_collector(sqlite_url: str, live_server) -> None:  # type: ignore[no-untyped-def]
    srv = live_server(sqlite_url)
    engine = make_engine(sqlite_url)
    r = Reporter(srv.url)
    r.init(job_id="no-agent-job", rank=1)
    for i in range(1, 101):
        r.step(i, tokens=10)
    r.shutdown()  # folds the open window and posts it
    assert count(engine, "select coalesce(sum(steps), 0) from job_progress") == 100
    assert count(engine, "select count(distinct rank) from job_progress") == 1
    engine.dispose()
