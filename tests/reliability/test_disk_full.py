"""Issue 18 item 1: a full disk under the agent's spool. The agent keeps sampling, holds a
bounded backlog in memory while the disk refuses writes, goes back to the spool when space
returns, and counts every row it drops: produced == spooled + in memory + dropped, by (gpu, ts).

The first tests use the fault-injecting file layer (``faultfs.SmallDisk``) and run anywhere;
the last one mounts a real 5 MiB tmpfs when the test may (root with mount rights), with a live
collector, and counts produced against stored."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet.agent.runner import Agent, AgentConfig
from gpufleet.agent.simulator import SimulatedFleet
from gpufleet.agent.spool import Spool
from gpufleet.protocol import decode, decompress, unpack_samples

from ..agent.conftest import AgentThread, TickClock, stored
from .faultfs import SmallDisk, used_bytes

NODE = "sim-node-000"


def _agent(spool_dir: Path, url: str = "http://127.0.0.1:9", *, opener=open, clock=None, **kw) -> Agent:  # type: ignore[no-untyped-def]
    fleet = SimulatedFleet(nodes=1, gpus_per_node=4, start_ts=time.time() - 7200)
    cfg = AgentConfig(collector_url=url, node=NODE, spool_dir=spool_dir, interval_s=1.0, flush_s=5.0,
                      fsync=False, backoff_base_s=0.05, backoff_max_s=0.3, timeout_s=5.0, **kw)
    return Agent(cfg, fleet.source(NODE), clock=clock or TickClock(), opener=opener)


def _counter(agent: Agent, name: str) -> int:
    return int(agent.metrics.registry.get_sample_value(name) or 0)


def _drive(agent: Agent, cycles: int, t: list[float]) -> None:
    """``cycles`` sample cycles by hand, a flush every 5 (flush_s / interval_s)."""
    for _ in range(cycles):
        agent.cycle(t[0])
        t[0] += 1.0
        if agent._open is not None and len({ts for ts, _ in agent._open.rows}) >= 5:
            agent.flush()


def _spooled_keys(spool: Spool) -> set[tuple[str, float]]:
    """(gpu, ts) of every row the spool holds, on disk and in memory."""
    keys: set[tuple[str, float]] = set()
    for item in list(spool._items):
        header, body = item.read()
        hdrs = header["headers"]
        batch = decode(decompress(body, hdrs.get("Content-Encoding"), max_size=1 << 30), hdrs["Content-Type"])
        cols = unpack_samples(batch.packed) if batch.packed is not None else batch.samples
        keys.update(zip(cols.get("gpu", []), cols.get("ts", []), strict=True))  # type: ignore[arg-type]
    return keys


def test_agent_keeps_sampling_through_a_full_disk_and_resumes_the_spool(tmp_path: Path) -> None:
    disk = SmallDisk(tmp_path, capacity=1 << 30)
    agent = _agent(tmp_path / "spool", opener=disk)
    agent.start()
    t = [time.time() - 3600]
    _drive(agent, 20, t)
    disk.fill()  # something else took the rest of the disk
    _drive(agent, 100, t)  # twenty flushes on a full disk
    assert disk.refused > 0, "the fault layer refused writes"
    assert _counter(agent, "gpufleet_agent_samples_total") == 120 * 4, "sampling went on while the disk was full"
    assert agent.spool.memory_batches > 0, "refused batches wait in memory"
    disk.capacity = 1 << 30  # space is back
    _drive(agent, 20, t)
    agent.flush()
    assert agent.spool.memory_batches == 0, "the backlog went back to the disk once it had space"
    produced = _counter(agent, "gpufleet_agent_samples_total")
    assert produced == 140 * 4
    assert _counter(agent, "gpufleet_agent_rows_dropped_total") == 0, "the memory bound was never reached"
    keys = _spooled_keys(agent.spool)
    assert len(keys) == produced == agent.spool.pending_rows, "every row produced is in the spool, once"
    # ... and on disk for real: a new spool over the same directory finds them all
    assert Spool(tmp_path / "spool", 1 << 30).pending_rows == produced


def test_memory_backlog_is_bounded_and_every_dropped_row_counted(tmp_path: Path) -> None:
    disk = SmallDisk(tmp_path, capacity=1 << 30)
    agent = _agent(tmp_path / "spool", opener=disk, spool_memory_max_bytes=20_000)
    agent.start()
    t = [time.time() - 3600]
    _drive(agent, 10, t)
    disk.fill()
    _drive(agent, 400, t)  # far more than 20 kB of batches
    assert agent.spool.memory_bytes <= 20_000
    dropped = _counter(agent, "gpufleet_agent_rows_dropped_total")
    assert dropped > 0
    disk.capacity = 1 << 30
    _drive(agent, 10, t)
    agent.flush()
    produced = _counter(agent, "gpufleet_agent_samples_total")
    kept = _spooled_keys(agent.spool)
    assert len(kept) == agent.spool.pending_rows
    assert produced == len(kept) + dropped, "produced = kept + counted as dropped, nothing unaccounted"
    assert agent.spool.dropped_rows == dropped


def test_spool_write_cut_short_leaves_no_partial_file(tmp_path: Path) -> None:
    """A batch the disk refused halfway must not leave its partial temp file eating the space
    that would let the next write through."""
    disk = SmallDisk(tmp_path, capacity=0)
    s = Spool(tmp_path / "spool", 1 << 30, fsync=False, opener=disk)
    disk.capacity = used_bytes(tmp_path) + 3000
    s.put(b"x" * 10_000, {"Content-Type": "application/msgpack"}, "boot:1", rows=7)
    assert not list((tmp_path / "spool" / "queue").glob("*.tmp"))
    assert s.memory_batches == 1 and s.pending_rows == 7
    header, body = s.peek().read()  # type: ignore[union-attr]
    assert header["key"] == "boot:1" and body == b"x" * 10_000, "the sender can deliver it from memory"


# --- a real tmpfs with a live collector ----------------------------------------------------


@contextlib.contextmanager
def _tmpfs(path: Path, size: str) -> Iterator[Path]:
    path.mkdir(parents=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip() or r.returncode}); "
                    "the SmallDisk tests above cover the same paths")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def _fill(mount: Path) -> Path:
    """Take every free byte of the mount."""
    filler = mount / "filler"
    with open(filler, "wb", buffering=0) as f:  # unbuffered: nothing left to fail at close
        chunk = b"\0" * (1 << 20)
        with contextlib.suppress(OSError):
            while True:
                f.write(chunk)
                f.flush()
        with contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * 4096)
                f.flush()
        with contextlib.suppress(OSError):
            os.fsync(f.fileno())
    return filler


@pytest.mark.slow
def test_real_tmpfs_full_with_live_collector_loses_nothing(database_url, collector_process, tmp_path):  # type: ignore[no-untyped-def]
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    coll = collector_process(database_url).start()
    mount = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    with _tmpfs(mount, "5m"):
        fleet = SimulatedFleet(nodes=1, gpus_per_node=4, start_ts=time.time() - 7200)
        cfg = AgentConfig(collector_url=coll.url, node=NODE, spool_dir=mount / "spool", interval_s=0.05,
                          flush_s=0.25, backoff_base_s=0.05, backoff_max_s=0.3, timeout_s=5.0)
        agent = Agent(cfg, fleet.source(NODE), clock=TickClock())
        with AgentThread(agent) as at:
            time.sleep(1.0)
            filler = _fill(mount)
            with pytest.raises(OSError) as full:
                (mount / "probe").write_bytes(b"x" * 65536)
            assert full.value.errno == errno.ENOSPC
            before = _counter(agent, "gpufleet_agent_samples_total")

            def errors() -> float:
                return sum(agent.metrics.registry.get_sample_value("gpufleet_agent_disk_errors_total", {"what": w})
                           or 0 for w in ("journal", "spool"))

            # still sampling (20 cycles, 1 s at its pace) and the disk errors seen, on a full disk;
            # polled: a fixed 2 s sleep held too few cycles on a loaded box
            deadline = time.monotonic() + 60
            while not (_counter(agent, "gpufleet_agent_samples_total") > before + 20 and errors() > 0):
                assert time.monotonic() < deadline, (before, _counter(agent, "gpufleet_agent_samples_total"), errors())
                time.sleep(0.1)
            time.sleep(1.0)  # the scenario, not a wait: more flushes fail on the full disk before it frees
            filler.unlink()
            time.sleep(1.0)
            at.stop()
        produced = _counter(agent, "gpufleet_agent_samples_total")
        dropped = _counter(agent, "gpufleet_agent_rows_dropped_total")
        left = agent.spool.pending_rows
    rows, distinct = stored(database_url)
    print(f"FAULT disk-full-tmpfs: produced={produced} stored={rows} left={left} dropped={dropped} "
          f"duplicated={rows - distinct}")  # docs/reliability.md's fault matrix (pytest -s)
    assert produced > 0 and dropped == 0
    assert rows + left == produced, f"produced {produced}, stored {rows}, left in the spool {left}"
    assert distinct == rows, "nothing stored twice"
