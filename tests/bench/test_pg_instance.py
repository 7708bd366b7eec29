"""bench/pg_instance.py: the benchmarks' throwaway PostgreSQL starts with the production write
settings it claims, keeps durability on, and leaves nothing behind: not after a normal stop, and
not after its owner was killed with SIGKILL (the next start removes the leftover)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import pg_instance  # noqa: E402

GiB = 2**30


def test_settings_follow_the_machine_and_keep_durability() -> None:
    big = pg_instance.tuned_settings(ram=64 * GiB, free_disk=500 * GiB, lz4=True)
    assert big["shared_buffers"] == "8192MB"  # a quarter of 64 GiB, capped at 8 GiB
    assert big["max_wal_size"] == "16384MB"
    assert big["wal_compression"] == "lz4"
    assert (big["fsync"], big["synchronous_commit"], big["full_page_writes"]) == ("on", "on", "on")
    small = pg_instance.tuned_settings(ram=8 * GiB, free_disk=20 * GiB, lz4=False)
    assert small["shared_buffers"] == "2048MB"
    assert small["max_wal_size"] == "5120MB"  # a quarter of the free disk, not 16 GB
    assert small["min_wal_size"] == "1280MB"
    assert small["wal_compression"] == "off"
    with pytest.raises(RuntimeError, match="free"):
        pg_instance.tuned_settings(ram=8 * GiB, free_disk=3 * GiB, lz4=True)


def test_admin_url_specs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUFLEET_BENCH_PG", raising=False)
    assert pg_instance.admin_url("existing") == pg_instance.DEFAULT_EXISTING
    assert pg_instance.admin_url("existing", "postgresql://x@h:1/db") == "postgresql://x@h:1/db"
    monkeypatch.setenv("GPUFLEET_BENCH_PG", "postgresql://y@h:2/db")
    assert pg_instance.admin_url("existing") == "postgresql://y@h:2/db"
    assert pg_instance.admin_url("postgresql://z@h:3/db") == "postgresql://z@h:3/db"
    with pytest.raises(ValueError, match="tuned, existing"):
        pg_instance.admin_url("tunde")


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture
def pg_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    try:
        pg_instance.bindir()
    except RuntimeError as e:
        pytest.skip(str(e))
    if os.geteuid() == 0 and not shutil.which("runuser"):
        pytest.skip("running as root without runuser: cannot start a PostgreSQL server")
    # its own parent (not pytest's tmp_path: 0700 root, which the postgres user cannot enter), so
    # the leftover sweep sees only this test's instances
    d = Path(tempfile.mkdtemp(prefix="gpufleet-test-pginst-", dir="/var/tmp" if Path("/var/tmp").is_dir() else None))
    d.chmod(0o755)
    monkeypatch.setenv("GPUFLEET_BENCH_PG_DIR", str(d))
    try:
        yield d
    finally:
        pg_instance.remove_leftovers(d, pg_instance.bindir())
        shutil.rmtree(d, ignore_errors=True)


def test_instance_runs_the_tuned_settings_and_is_removed(pg_dir: Path) -> None:
    import psycopg

    with pg_instance.instance() as inst:
        assert inst.dir.parent == pg_dir and inst.data.is_dir()
        running = pg_instance.reported_settings(inst.url)
        want = pg_instance.tuned_settings(pg_instance.ram_bytes(), shutil.disk_usage(pg_dir).free,
                                          pg_instance.supports_lz4(inst.bin))
        for k in ("checkpoint_timeout", "checkpoint_completion_target", "wal_compression", "wal_buffers",
                  "fsync", "synchronous_commit", "full_page_writes", "wal_level"):
            assert running[k] == want[k], k
        # sizes: the server shows its own units (8GB, 6026MB); compare in MB. max_wal_size follows
        # the free disk when the instance started (a quarter of it, under 64 GiB free), which
        # other work on the machine moves by the next statement: compared with what the
        # instance was started with (the rule itself: test_settings_follow_the_machine_...)
        assert inst.settings["shared_buffers"] == want["shared_buffers"]
        with psycopg.connect(inst.url, autocommit=True) as c:
            for k in ("shared_buffers", "max_wal_size"):
                mb = c.execute("select pg_size_bytes(current_setting(%s)) / 1048576", (k,)).fetchone()[0]
                assert f"{mb}MB" == inst.settings[k], k
            before = pg_instance.server_stats(inst.url)
            c.execute("create table t (x int)")
            c.execute("insert into t select generate_series(1, 10000)")
        after = pg_instance.server_stats(inst.url)
        d = pg_instance.stats_delta(before, after)
        assert d["wal_lsn_bytes"] > 10000 * 20  # the rows went through the WAL
        assert d["wal_records"] >= 10000
        assert before["cpu_s"] is not None and after["cpu_s"] is not None  # a local server: measurable
        port, where = inst.port, inst.dir
    assert not where.exists()
    assert not _listening(port)


def test_instance_of_a_killed_owner_is_removed_by_the_next_start(pg_dir: Path) -> None:
    code = ("import sys, time; sys.path.insert(0, sys.argv[1]); import pg_instance; i = pg_instance.start(); "
            "print(i.port, i.dir, flush=True); time.sleep(120)")
    p = subprocess.Popen([sys.executable, "-c", code, str(BENCH)], stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "GPUFLEET_BENCH_PG_DIR": str(pg_dir)})
    try:
        assert p.stdout is not None
        port_s, where_s = p.stdout.readline().split(maxsplit=1)
        port, where = int(port_s), Path(where_s.strip())
        assert _listening(port)
    finally:
        p.send_signal(signal.SIGKILL)  # no atexit, no handler: the instance is left running
        p.wait(30)
    assert where.exists() and _listening(port)
    assert pg_instance.remove_leftovers(pg_dir, pg_instance.bindir()) == 1
    assert not where.exists()
    end = time.time() + 10
    while _listening(port) and time.time() < end:
        time.sleep(0.1)
    assert not _listening(port)
