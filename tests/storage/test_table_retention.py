"""Retention of the tables that grow with time besides samples, rollups and minute features
(``retention.ROW_PRUNED`` and web sessions), on SQLite and PostgreSQL: each row past its
table's horizon goes, each recent one stays, and a second pass removes nothing more.

Horizons (docs/collector.md, "Retention"): training-progress windows, NCCL collective windows,
NIC samples, the idempotency ledger and delivered or abandoned alert notifications go with the
raw samples (``raw_days``); node events with the rollups (``rollup_days``); a web session once
it has expired. A notification still pending is kept however old it is."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, Table, func, insert, select

from gpufleet.storage import retention
from gpufleet.storage.alert_models import AlertOutbox
from gpufleet.storage.collectives_models import CollectiveWindow, NicSampleRow
from gpufleet.storage.db import make_engine
from gpufleet.storage.models import Event, IngestBatch, Job, Node
from gpufleet.storage.progress_models import JobProgress
from gpufleet.storage.session_models import WebSession
from tests.collector.conftest import make_batch, store

DAY = 86400
RAW_DAYS, ROLLUP_DAYS = 31, 400
NOW = 1_790_000_000.0 + ROLLUP_DAYS * DAY
RAW_CUT, ROLLUP_CUT = NOW - RAW_DAYS * DAY, NOW - ROLLUP_DAYS * DAY


def _progress(job_pk: int, node_id: int, start: float, end: float) -> dict[str, Any]:
    return {"job_pk": job_pk, "node_id": node_id, "rank": 0, "pid": 1, "start_ts": start, "end_ts": end,
            "steps": 10, "restarts": 0, "lost_steps": 0, "productive_s": end - start, "stall_s": 0.0,
            "unfinished_s": 0.0, "alive": True, "ended": False, "dropped": 0}


def _collective(node_id: int, ts: float) -> dict[str, Any]:
    return {"node_id": node_id, "ts": ts, "window_s": 10.0, "comm": "c0", "rank": 0, "coll": "AllReduce",
            "size_bucket": 20, "count": 5, "bytes": 1e6, "exec_us_p50": 100.0, "exec_us_p95": 120.0,
            "exec_us_max": 130.0}


def _outbox(key: str, state: str, created: float) -> dict[str, Any]:
    return {"idempotency_key": key, "event": "firing", "webhook_url": "http://hook.invalid/x", "payload": {},
            "state": state, "attempts": 1, "created_at": created, "next_attempt_at": created}


def _session(h: str, expires: float) -> dict[str, Any]:
    return {"session_hash": h, "name": "alice", "role": "viewer", "source": "token", "created_at": expires - 3600,
            "expires_at": expires}


def _left(e: Engine, table: Table, col: str) -> list[Any]:
    with e.connect() as c:
        return sorted(c.execute(select(table.c[col])).scalars())


def test_tables_growing_with_time_are_pruned_by_their_horizon(database_url: str) -> None:
    e = make_engine(database_url)
    try:
        with e.begin() as c:
            store(c, [make_batch("r1", start=NOW - 60, gpus=1, seconds=2)], NOW)
            node_id = c.execute(select(Node.id)).scalar_one()
            job_pk = c.execute(select(Job.id)).scalar_one()
            rows: dict[Table, list[dict[str, Any]]] = {
                # ended just before the cutoff: gone; started before it but ended after: kept
                JobProgress.__table__: [_progress(job_pk, node_id, RAW_CUT - 11, RAW_CUT - 1),
                                        _progress(job_pk, node_id, RAW_CUT - 5, RAW_CUT + 5)],
                CollectiveWindow.__table__: [_collective(node_id, RAW_CUT - 1), _collective(node_id, RAW_CUT + 1)],
                NicSampleRow.__table__: [{"node_id": node_id, "ts": t, "nic": "mlx5_0/1", "interval_s": 10.0}
                                         for t in (RAW_CUT - 1, RAW_CUT + 1)],
                # events keep the rollups' horizon: one older than the raw cutoff stays
                Event.__table__: [{"node_id": node_id, "ts": t, "kind": "xid", "code": 79, "message": ""}
                                  for t in (ROLLUP_CUT - 1, RAW_CUT - 100)],
                AlertOutbox.__table__: [_outbox("old-sent", "sent", RAW_CUT - 1),
                                        _outbox("old-failed", "failed", RAW_CUT - 1),
                                        _outbox("old-pending", "pending", RAW_CUT - 1),
                                        _outbox("new-sent", "sent", RAW_CUT + 1)],
                WebSession.__table__: [_session("expired", NOW - 1), _session("valid", NOW + 3600)],
                IngestBatch.__table__: [{"boot_id": "old-boot", "seq": 0, "node_id": node_id,
                                         "received_at": RAW_CUT - 1, "rows": 1}],
            }
            for table, values in rows.items():
                c.execute(insert(table), values)
        out = retention.apply_retention(e, NOW, raw_days=RAW_DAYS, rollup_days=ROLLUP_DAYS)
        assert _left(e, JobProgress.__table__, "end_ts") == [RAW_CUT + 5]
        assert _left(e, CollectiveWindow.__table__, "ts") == [RAW_CUT + 1]
        assert _left(e, NicSampleRow.__table__, "ts") == [RAW_CUT + 1]
        assert _left(e, Event.__table__, "ts") == [RAW_CUT - 100]
        assert _left(e, AlertOutbox.__table__, "idempotency_key") == ["new-sent", "old-pending"]
        assert _left(e, WebSession.__table__, "session_hash") == ["valid"]
        assert _left(e, IngestBatch.__table__, "boot_id") == ["boot-r1"]  # the batch just stored stays
        assert {t: out[t] for t in (*retention.ROW_PRUNED, "web_sessions")} == {
            "ingest_batches": 1, "job_progress": 1, "collective_windows": 1, "nic_samples": 1, "alert_outbox": 2,
            "events": 1, "web_sessions": 1}
        again = retention.apply_retention(e, NOW, raw_days=RAW_DAYS, rollup_days=ROLLUP_DAYS)
        assert all(again[t] == 0 for t in (*retention.ROW_PRUNED, "web_sessions")), again
        with e.connect() as c:
            assert c.execute(select(func.count()).select_from(JobProgress.__table__)).scalar_one() == 1
    finally:
        e.dispose()
