"""Issue 38's intake findings, each against the real collector on SQLite and PostgreSQL: a side
record (a progress window, an NCCL collective, a NIC sample) that the database cannot store is
refused by itself, naming its section, row and field, and the batch's GPU rows are stored (200,
never 500); a stored progress window cannot break the readers (fleet summary, job, progress).
Each of these answered 500 (or lost the GPU rows) before the intake schema."""

from __future__ import annotations

import time
from typing import Any

import httpx
import msgspec
import pytest
from sqlalchemy import text

from gpufleet import protocol
from gpufleet.protocol import AgentInfo, Batch, CollectiveAgg, NicSample, ProgressWindow
from gpufleet.storage.db import make_engine
from tests.collector.conftest import make_batch


def window(**kw: Any) -> ProgressWindow:
    s = (time.time() // 10) * 10 - 60
    base: dict[str, Any] = {"job_id": "train-1", "rank": 0, "pid": 42, "start": s, "end": s + 10, "steps": 5,
                            "first_step": 1, "last_step": 5, "max_step": 5, "productive_s": 4.0}
    base.update(kw)
    return ProgressWindow(**base)


def collective(**kw: Any) -> CollectiveAgg:
    base: dict[str, Any] = {"ts": time.time() - 60, "comm": "0xabc", "rank": 0, "coll": "AllReduce",
                            "size_bucket": 1 << 20, "count": 3, "bytes": 3e6, "exec_us_p50": 10.0,
                            "exec_us_p95": 12.0, "exec_us_max": 15.0}
    base.update(kw)
    return CollectiveAgg(**base)


def nic(**kw: Any) -> NicSample:
    base: dict[str, Any] = {"ts": time.time() - 60, "nic": "mlx5_0/1", "interval_s": 10.0}
    base.update(kw)
    return NicSample(**base)


def send(url: str, batch: Batch) -> httpx.Response:
    body, headers = protocol.encode(batch)
    return httpx.post(url + "/api/v1/ingest", content=body, headers=headers, timeout=60)


def scalar(engine: Any, sql: str) -> int:
    with engine.connect() as c:
        return int(c.execute(text(sql)).scalar_one())


def with_side(seq: int, **sections: Any) -> Batch:
    b = make_batch("node-f", seq=seq, boot_id="boot-f", gpus=2, seconds=3, start=time.time() - 120)
    return msgspec.structs.replace(b, **sections)


# (section, the bad record, the field the answer names)
BAD: list[tuple[str, Any, str]] = [
    ("progress", window(events=[{"ts": time.time(), "name": "loss", "fields": {"loss": float("nan")}}]), "events"),
    ("progress", window(first_step=2**63 - 1, last_step=2**63), "last_step"),
    ("progress", window(rank=2**31), "rank"),
    ("progress", window(job_id="job\x00x"), "job_id"),
    ("progress", window(spans={"fwd\x00": 1.0}), "spans"),
    ("progress", window(tokens=-5), "tokens"),  # finding 11: documented bounds
    ("progress", window(end=window().start - 10), "end"),  # finding 11: start > end
    ("progress", window(step_hist={"8000": 1}), "step_hist"),  # finding 7
    ("progress", window(productive_s=float("inf")), "productive_s"),
    ("collectives", collective(rank=2**31), "rank"),
    ("collectives", collective(comm="0x\x00"), "comm"),
    ("collectives", collective(ts=86400.0), "ts"),  # 1970
    ("collectives", collective(n_ranks=2**40), "n_ranks"),
    ("collectives", collective(pid=-(2**40)), "pid"),
    ("nics", nic(counters={"port_rcv_errors": float("nan")}), "counters"),
    ("nics", nic(state="UP\x00"), "state"),
]


@pytest.mark.parametrize("section,bad,field", BAD, ids=[f"{s}.{f}-{i}" for i, (s, _, f) in enumerate(BAD)])
def test_a_bad_side_record_is_refused_alone_and_gpu_rows_are_stored(
        database_url: str, live_server: Any, section: str, bad: Any, field: str) -> None:
    srv = live_server(database_url)
    engine = make_engine(database_url)
    good = {"progress": window(rank=7), "collectives": collective(rank=7), "nics": nic(nic="mlx5_1/1")}[section]
    b = with_side(0, **{section: [good, bad]})
    r = send(srv.url, b)
    assert r.status_code == 200, r.text
    ans = r.json()
    assert ans["stored"] == b.n_rows() > 0
    assert [(x["part"], x["row"], x["field"]) for x in ans["refused"]] == [(section, 1, field)], ans
    assert f"{section}[1].{field}" in ans["refused"][0]["detail"]
    table = {"progress": "job_progress", "collectives": "collective_windows", "nics": "nic_samples"}[section]
    assert scalar(engine, f"select count(*) from {table}") == 1  # the good one
    # resent (lost acknowledgement): a duplicate, nothing stored twice
    r2 = send(srv.url, b)
    assert r2.status_code == 200 and r2.json()["duplicate"] is True, r2.text
    assert scalar(engine, f"select count(*) from {table}") == 1
    engine.dispose()


def test_a_batch_of_nothing_but_bad_records_is_refused_with_4xx(sqlite_url: str, live_server: Any) -> None:
    srv = live_server(sqlite_url)
    b = Batch(agent=AgentInfo(boot_id="b-only", seq=0, node="n1"), progress=[window(rank=2**31)])
    r = send(srv.url, b)
    assert r.status_code == 422 and "progress[0].rank" in r.json()["detail"], r.text


def test_a_stored_out_of_range_histogram_never_breaks_the_readers(database_url: str, live_server: Any) -> None:
    """Finding 7: a window whose step_hist holds bucket 8000 (1.1^8000 s overflows a float) was
    stored and then /api/v1/fleet/summary, the job and its progress answered 500. The intake
    refuses it now; a row that got in before (or by another path) is read without that bucket."""
    srv = live_server(database_url)
    engine = make_engine(database_url)
    assert send(srv.url, with_side(0, progress=[window(job_id="hist-job")])).status_code == 200
    with engine.begin() as c:
        c.execute(text("update job_progress set step_hist = :h"), {"h": '{"8000": 1, "3": 2, "x": 1, "-9999": 4}'})
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        for path in ("/api/v1/fleet/summary", "/api/v1/jobs/hist-job", "/api/v1/jobs/hist-job/progress"):
            r = c.get(path)
            assert r.status_code < 500, (path, r.status_code, r.text[:500])
    engine.dispose()


def test_the_agent_keeps_only_the_refused_records_and_its_gpu_rows_flow(
        database_url: str, live_server: Any, tmp_path: Any) -> None:
    """Finding 1 from the agent's side: a node whose trainer reported loss=nan (and a rank past
    int4) kept answering 500 and retrying forever; its GPU rows stopped. Now the batch is
    acknowledged, the next one goes through, the refused windows alone are kept (refused.jsonl)
    and counted on the agent's /metrics."""
    from prometheus_client import generate_latest

    from gpufleet.agent.metrics import AgentMetrics
    from gpufleet.agent.sender import Outcome, Sender
    from gpufleet.agent.spool import Spool

    srv = live_server(database_url)
    engine = make_engine(database_url)
    spool = Spool(tmp_path / "spool", 10**8, fsync=False)
    bad = [window(rank=2**31), window(rank=3, events=[{"ts": 1.0, "name": "e", "fields": {"loss": float("nan")}}])]
    for seq in range(3):
        b = with_side(seq, progress=[window(rank=seq), *bad] if seq == 0 else [window(rank=seq)])
        body, headers = protocol.encode(b)
        spool.put(body, headers, b.idempotency_key, rows=b.n_rows())
    metrics = AgentMetrics("node-f")
    sender = Sender(spool, srv.url, token=None, metrics=metrics)
    outcomes = [sender.send_one() for _ in range(4)]
    assert [o[0].outcome for o in outcomes[:3] if o] == [Outcome.SENT] * 3 and outcomes[3] is None
    assert len(spool) == 0
    assert scalar(engine, "select count(*) from job_progress") == 3
    lines = (tmp_path / "spool" / "dead" / "refused.jsonl").read_text().splitlines()
    import json

    kept = [json.loads(x) for x in lines]
    assert [(k["part"], k["row"], k["field"]) for k in kept] == [("progress", 1, "rank"), ("progress", 2, "events")]
    assert kept[0]["record"]["rank"] == 2**31 and kept[0]["key"] == "boot-f:0"
    text_metrics = generate_latest(metrics.registry).decode()
    assert 'gpufleet_agent_records_refused_total{section="progress"} 2.0' in text_metrics
    sender.close()
    engine.dispose()


@pytest.mark.parametrize("status", [404, 405, 408, 410, 411, 418, 451])
def test_the_agent_never_retries_a_batch_the_collector_refused(tmp_path: Any, status: int) -> None:
    """A 4xx is the batch's fault (or the setup's: 401/403/404/405/409 keep it and say so); any
    other 4xx used to be retried with backoff forever, blocking every batch behind it."""
    import httpx as hx

    from gpufleet.agent.sender import Outcome, Sender
    from gpufleet.agent.spool import Spool

    def handler(request: hx.Request) -> hx.Response:
        return hx.Response(status, json={"detail": "no"})

    spool = Spool(tmp_path / "spool", 10**7, fsync=False)
    spool.put(b"x", {"Content-Type": "application/msgpack"}, "k:0", rows=1)
    sender = Sender(spool, "http://collector", token=None, client=hx.Client(transport=hx.MockTransport(handler)))
    r, _ = sender.send_one()  # type: ignore[misc]
    expected = Outcome.AUTH if status in (404, 405) else Outcome.DEAD
    assert r.outcome is expected
    assert len(spool) == (1 if expected is Outcome.AUTH else 0)
