"""A clean exit is recorded by every sink: a process that says it exits (shutdown / atexit) ends
its stream whether the agent's relay folds it (``close_due``) or the HTTP sink folds it in the
process and closes right after (``close_all``). Before, the HTTP sink sent the last window as
still alive, and ranks that had finished their work read as a critical ``hung`` (issue 36)."""

from __future__ import annotations

import time
from typing import Any

import httpx
from sqlalchemy import select

from gpufleet.analysis.progress.detect import ProgressThresholds, detect_hung
from gpufleet.analysis.progress.model import Window
from gpufleet.progress import Reporter
from gpufleet.progress_fold import Folder
from gpufleet.storage.db import make_engine
from gpufleet.storage.progress_models import JobProgress

WALL0, MONO0 = 1_800_000_000.0, 5000.0


def _windows(raw: list[dict[str, Any]]) -> list[Window]:
    keys = set(Window.__dataclass_fields__) - {"start", "end", "node"}
    return [Window(start=w["start"], end=w["end"], **{k: w[k] for k in keys if k in w}) for w in raw]


def test_close_all_ends_a_stream_whose_process_said_it_exits() -> None:
    f = Folder()
    ident = {"job": "j", "rank": 0, "host": "h"}
    evs = [["s", MONO0 + i, i] for i in range(1, 31)]
    f.feed({"pid": 7, "wall0": WALL0, "mono0": MONO0, "now": MONO0 + 30, "id": ident, "ev": evs}, MONO0 + 30)
    # 200 s of teardown (saving results, closing files), then the exit record and the sink closes
    f.feed({"pid": 7, "wall0": WALL0, "mono0": MONO0, "now": MONO0 + 230, "id": ident,
            "ev": [["x", MONO0 + 230]]}, MONO0 + 230)
    ws = f.close_all(WALL0 + 231, MONO0 + 231)
    assert ws[-1]["ended"] and not ws[-1]["alive"] and not f.streams
    th = ProgressThresholds.load()
    assert detect_hung(_windows(ws), WALL0 + 240, th) is None


def test_a_rank_that_exits_cleanly_over_http_is_not_hung(database_url: str, live_server) -> None:  # type: ignore[no-untyped-def]
    srv = live_server(database_url)
    t = [0.0]
    real = time.time()
    r = Reporter(srv.url, start_thread=False, clock=lambda: t[0], wall=lambda: real - 300.0)
    r.init(job_id="clean-http", rank=0, world_size=1)
    for i in range(1, 61):
        t[0] = float(i)
        r.step(i)
    r.flush()
    t[0] = 290.0  # the work ended at 60 s; the process tears down, then exits cleanly
    r.shutdown()
    eng = make_engine(database_url)
    try:
        with eng.connect() as c:
            rows = c.execute(select(JobProgress.__table__).order_by(JobProgress.__table__.c.end_ts)).mappings().all()
    finally:
        eng.dispose()
    assert rows and rows[-1]["ended"] and not rows[-1]["alive"], rows[-1]
    g = httpx.get(f"{srv.url}/api/v1/jobs/clean-http", timeout=30).json()["goodput"]
    assert g["source"] == "progress"
    assert [f for f in g["findings"] if f["kind"] == "hung"] == []
