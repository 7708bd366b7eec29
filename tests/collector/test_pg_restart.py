"""PostgreSQL restarted during ingest: the collector answers 503 while it is down, the
agent's spool keeps and retries the same batches (same idempotency keys), and after
recovery every row is stored exactly once, counted end to end.

Runs its own throwaway PostgreSQL from the installed binaries so restarting it disturbs
nobody else's tests."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from gpufleet import protocol
from gpufleet.storage.db import make_engine
from gpufleet.storage.migrate import upgrade
from gpufleet.storage.raw_read import raw_records

from .conftest import make_batch

PG_BIN = Path(os.environ.get("GPUFLEET_PG_BIN", "/usr/lib/postgresql/15/bin"))


def _as_postgres(args: list[str]) -> list[str]:
    if os.geteuid() == 0:  # the server refuses to run as root
        return ["runuser", "-u", "postgres", "--", *args]
    return args


class ThrowawayPg:
    def __init__(self) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.dir = Path(tempfile.mkdtemp(prefix="gpufleet-pg-"))
        self.data = self.dir / "data"
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
        subprocess.run(_as_postgres([str(PG_BIN / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres",
                                     "--no-sync", "-E", "UTF8"]), check=True, capture_output=True, timeout=120)
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        opts = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=50"
        cmd = [str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-o", opts, "-w", "-t", "60", "-l",
               str(self.dir / "log"), "start"]
        subprocess.run(_as_postgres(cmd), check=True, capture_output=True, timeout=90)

    def stop(self, mode: str = "fast") -> None:
        subprocess.run(_as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop"]),
                       capture_output=True, timeout=90)

    def destroy(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def throwaway_pg() -> Iterator[ThrowawayPg]:
    if not (PG_BIN / "initdb").exists():
        pytest.skip(f"PostgreSQL server binaries not found in {PG_BIN} (set GPUFLEET_PG_BIN)")
    if os.geteuid() == 0 and not shutil.which("runuser"):
        pytest.skip("running as root without runuser: cannot start a PostgreSQL server")
    pg = ThrowawayPg()
    try:
        pg.start()
        yield pg
    finally:
        pg.destroy()


def test_restart_during_ingest_loses_and_duplicates_nothing(throwaway_pg, live_server, tmp_path) -> None:
    from gpufleet.agent.sender import Sender
    from gpufleet.agent.spool import Spool

    pg = throwaway_pg
    upgrade(pg.url)
    srv = live_server(pg.url)
    spool = Spool(tmp_path / "spool", 256 * 2**20, fsync=False)
    sender = Sender(spool, srv.url, token=None, timeout_s=10, backoff_base_s=0.05, backoff_max_s=0.3,
                    retry_after_max_s=0.3)
    statuses: list[int | None] = []
    stored = [0]
    orig_post = sender.post

    def post(item):  # type: ignore[no-untyped-def]
        r = orig_post(item)
        statuses.append(r.status)
        stored[0] += r.stored if r.status == 200 else 0
        return r

    sender.post = post  # type: ignore[method-assign]
    stop = threading.Event()
    sending = threading.Thread(target=sender.run, args=(stop,), daemon=True)
    sending.start()

    n_batches, nodes = 60, 3
    start = time.time() - 600
    made = 0

    def produce(k: int) -> None:
        nonlocal made
        for _ in range(k):
            node = f"node-{made % nodes}"
            seq = made // nodes
            b = make_batch(node, seq=seq, start=start + seq * 10, gpus=4, seconds=10, job=f"job-{node}")
            body, headers = protocol.encode(b)
            assert spool.put(body, headers, b.idempotency_key, b.n_rows()) is not None
            sender.wake.set()
            made += 1
            time.sleep(0.01)

    try:
        produce(20)
        pg.stop("fast")  # connections die mid-stream; the pool must recover later
        t_down = time.time()
        produce(20)
        while time.time() - t_down < 1.5:  # stay down long enough for retries to hit it
            time.sleep(0.1)
        down_503 = statuses.count(503)
        pg.start()
        produce(n_batches - 40)
        deadline = time.time() + 300  # only catches a hang (a loaded box is slow, not stuck)
        while len(spool) and time.time() < deadline:
            sender.wake.set()
            time.sleep(0.1)
    finally:
        stop.set()
        sending.join(10)
        sender.close()
    assert len(spool) == 0, f"{len(spool)} batches still spooled"
    assert down_503 >= 1, statuses  # the collector said "retry later" while the database was down
    assert not [s for s in statuses if s not in (200, 503, None)], statuses
    e = make_engine(pg.url)
    with e.connect() as c:
        keys = [(r["gpu_pk"], r["ts"]) for r in raw_records(c)]
        rows, distinct = len(keys), len(set(keys))
        ledger = c.execute(text("select count(*) from ingest_batches")).scalar_one()
        roll_n = c.execute(text("select coalesce(sum(n), 0) from gpu_samples_1m")).scalar_one()
    e.dispose()
    expected = n_batches * 40
    assert rows == distinct == expected == roll_n, (rows, distinct, roll_n)
    assert ledger == n_batches
    assert stored[0] == expected  # every row acknowledged as stored exactly once
