"""Issue 38 item 5, over real HTTP on SQLite and PostgreSQL: a node-scoped agent token writes
only for jobs on its own GPUs. A job description, a progress window or a collective record for
a job not running on the node's GPUs is refused by itself (403 in the answer's ``refused``,
naming the record) and the rest of the batch is stored; a node that puts another node's job on
its own GPU still cannot change who that job is blamed on (user, name, account)."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import text

from gpufleet.protocol import CollectiveAgg, JobInfo, ProgressWindow
from gpufleet.storage import tokens
from gpufleet.storage.db import make_engine
from tests.collector.conftest import make_batch
from tests.collector.test_ingest import post


def _window(job: str, rank: int = 0) -> ProgressWindow:
    s = (time.time() // 10) * 10 - 60
    return ProgressWindow(job_id=job, rank=rank, pid=42, start=s, end=s + 10, steps=5, first_step=1, last_step=5,
                          max_step=5, productive_s=4.0)


def _collective(job: str, rank: int = 0) -> CollectiveAgg:
    return CollectiveAgg(ts=time.time() - 60, comm="0xabc", rank=rank, coll="AllReduce", size_bucket=1 << 20,
                         count=3, bytes=3e6, exec_us_p50=10.0, exec_us_p95=12.0, exec_us_max=15.0, job_id=job)


def _q(url: str, sql: str) -> list[Any]:
    e = make_engine(url)
    try:
        with e.connect() as c:
            return [tuple(r) for r in c.execute(text(sql))]
    finally:
        e.dispose()


def _job(url: str, job: str) -> tuple[Any, ...]:
    return _q(url, f"select \"user\", name, account from jobs where job_id = '{job}'")[0]


def _progress_jobs(url: str) -> list[str]:
    return sorted(r[0] for r in _q(url, "select j.job_id from job_progress p join jobs j on j.id = p.job_pk"))


def _collective_jobs(url: str) -> list[str]:
    return sorted(r[0] for r in _q(url, "select j.job_id from collective_windows c join jobs j on j.id = c.job_pk"))


def test_node_token_writes_only_for_jobs_on_its_own_gpus(database_url: str, live_server) -> None:  # type: ignore[no-untyped-def]
    e = make_engine(database_url)
    ta = tokens.create_token(e, "a", "agent", cluster="default", node="node-a")
    tb = tokens.create_token(e, "b", "agent", cluster="default", node="node-b")
    tc = tokens.create_token(e, "c", "agent", cluster="default", node="node-c")
    e.dispose()
    srv = live_server(database_url, allow_anonymous=False)
    now = time.time() - 120
    a = make_batch("node-a", seq=0, start=now, gpus=2, seconds=2, job="777", user="bob")
    a.jobs[0].name = "train"
    assert post(srv.url, a, token=ta).json() == {"stored": 4, "duplicate": False}

    # node-b, on its own GPUs running own-b, sends records for node-a's job 777 among its own
    b = make_batch("node-b", seq=0, start=now, gpus=2, seconds=2, job="own-b", user="carol")
    b.jobs.append(JobInfo(job_id="777", source="slurm", user="mallory", name="hijacked"))
    b.progress = [_window("own-b"), _window("777")]
    b.collectives = [_collective("777"), _collective("own-b")]
    r = post(srv.url, b, token=tb)
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["stored"] == 4 and got["refused_count"] == 3, got
    refused = {(x["part"], x["row"]): x for x in got["refused"]}
    assert set(refused) == {("jobs", 1), ("progress", 1), ("collectives", 0)}, got
    assert all(x["status"] == 403 and "777" in x["detail"] for x in refused.values()), got
    assert _job(database_url, "777") == ("bob", "train", None)
    assert _progress_jobs(database_url) == ["own-b"] and _collective_jobs(database_url) == ["own-b"]

    # the finding itself: node-b puts job 777 on its own GPU and describes it as mallory's
    h = make_batch("node-b", seq=1, start=now + 10, gpus=2, seconds=2, job="777", user="mallory")
    h.jobs[0].name = "hijacked"
    r = post(srv.url, h, token=tb)
    assert r.status_code == 200 and r.json()["stored"] == 4, r.text
    (x,) = r.json()["refused"]
    assert (x["part"], x["row"], x["status"]) == ("jobs", 0, 403) and "777" in x["detail"], x
    assert _job(database_url, "777") == ("bob", "train", None), "who the job is blamed on is unchanged"

    # another node of the same job says the same and fills what was unknown: accepted
    c = make_batch("node-c", seq=0, start=now, gpus=1, seconds=2, job="777", user="bob")
    c.jobs[0].name, c.jobs[0].account = "train", "ml-team"
    c.progress = [_window("777", rank=8)]
    assert post(srv.url, c, token=tc).json() == {"stored": 2, "duplicate": False}
    assert _job(database_url, "777") == ("bob", "train", "ml-team")

    # a later batch of node-a without rows of 777 (the job is on its GPUs in the database):
    # its progress and collectives are node-a's own
    later = make_batch("node-a", seq=1, start=now + 20, gpus=2, seconds=0, job=None)
    later.progress = [_window("777", rank=1)]
    later.collectives = [_collective("777", rank=1)]
    r = post(srv.url, later, token=ta)
    assert r.status_code == 200 and "refused" not in r.json(), r.text
    assert _progress_jobs(database_url).count("777") == 2 and _collective_jobs(database_url).count("777") == 1

    # a cluster-wide token (a relay) is not node-scoped: it may describe any job of its cluster
    tr = tokens.create_token(make_engine(database_url), "relay", "agent", cluster="default")
    d = make_batch("node-r", seq=0, start=now, gpus=1, seconds=1, job=None)
    d.jobs = [JobInfo(job_id="777", source="slurm", user="bob", name="train-renamed")]
    assert post(srv.url, d, token=tr).status_code == 200
    assert _job(database_url, "777") == ("bob", "train-renamed", "ml-team")


def test_screen_decisions_without_a_database() -> None:
    """storage.scope's pure part: what counts as the node's own job, and what a shared job's
    description may do."""
    from gpufleet.protocol import Allocation
    from gpufleet.storage.scope import NodeFacts, needs_facts, screen_node_records

    b = make_batch("n1", gpus=1, seconds=1, start=time.time() - 60, job="mine")
    b.allocations = [Allocation(gpu_uuid=b.gpus[0].uuid, job_id="alloc-own", since=time.time() - 90),
                     Allocation(gpu_uuid="GPU-someone-elses", job_id="alloc-foreign", since=time.time() - 90)]
    b.progress = [_window("mine"), _window("alloc-own"), _window("alloc-foreign"), _window("db-own")]
    b.collectives = [_collective("db-own")]
    b.collectives[0].job_id = None  # no job named: nothing to decide
    rows = b.samples["job"]
    assert not needs_facts(msgspec_replace(b, jobs=[], progress=b.progress[:2], collectives=[]), rows)
    assert needs_facts(b, rows)
    facts = NodeFacts(frozenset(), frozenset({"db-own"}), {}, frozenset())
    changes, refused = screen_node_records(b, rows, facts)
    assert [(r.part, r.row) for r in refused] == [("progress", 2)]
    assert [w.job_id for w in changes["progress"]] == ["mine", "alloc-own", "db-own"]

    # a shared job: unknown attributes may be filled, known ones not changed
    stored = NodeFacts(frozenset(), frozenset(), {"mine": ("bob", None, None)}, frozenset({"mine"}))
    for info, ok in ((JobInfo(job_id="mine", user="bob", name="train"), True),
                     (JobInfo(job_id="mine", user=None, account="ml"), True),
                     (JobInfo(job_id="mine", user="mallory"), False)):
        d = msgspec_replace(b, jobs=[info], progress=[], collectives=[])
        _, refused = screen_node_records(d, rows, stored)
        assert (not refused) is ok, (info, refused)
        if not ok:
            assert "user" in refused[0].message and refused[0].part == "jobs"


def msgspec_replace(b: Any, **kw: Any) -> Any:
    import msgspec

    return msgspec.structs.replace(b, **kw)
