"""Database housekeeping, one owner: partitions ahead (PostgreSQL), stale jobs ended, retention.

Every pass is cheap and idempotent (partition creation takes an advisory lock, closing a stale
job is one UPDATE guarded by its state, retention drops what is past its cutoff), so every server
process may run ``MaintenanceLoop`` without coordinating: ``gpufleet serve`` (each collector
worker, from the collector's lifespan), ``gpufleet up`` (the same lifespan) and ``gpufleet worker``
(the Celery main process). A deployment with only collectors or only workers is still kept.

The policy is a plain ``Policy`` so storage does not depend on the settings model; the server's
``MaintenanceSettings`` has the same field names and is accepted as is."""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from types import TracebackType
from typing import Protocol

from sqlalchemy import Engine

from gpufleet.storage import retention
from gpufleet.storage.raw_compact import compact_windows

log = logging.getLogger(__name__)


class Policy(Protocol):
    # Read-only: frozen dataclasses and the (frozen) settings section both fit.
    @property
    def interval_s(self) -> float: ...
    @property
    def retention_interval_s(self) -> float: ...
    @property
    def raw_days(self) -> float: ...
    @property
    def rollup_days(self) -> float: ...
    @property
    def stale_job_s(self) -> float: ...


@dataclass(frozen=True)
class DefaultPolicy:
    interval_s: float = 60.0
    retention_interval_s: float = 3600.0
    raw_days: float = 31.0
    rollup_days: float = 400.0
    stale_job_s: float = 300.0


@dataclass
class PassResult:
    partitions_created: int = 0
    jobs_closed: int = 0
    windows_compacted: int = 0
    retention: dict[str, int] | None = None  # None: not due this pass
    errors: list[str] = field(default_factory=list)


def close_stale(engine: Engine, now: float, stale_after_s: float) -> int:
    """End running jobs that no node reported for ``stale_after_s``; returns how many."""
    from gpufleet.storage.jobs import close_stale_jobs

    with engine.begin() as conn:
        return int(close_stale_jobs(conn, now, stale_after_s) or 0)


def run_once(engine: Engine, now: float, policy: Policy, *, retention_due: bool = True) -> PassResult:
    """One pass. Each step runs on its own, so a failing one (the database restarting, a lock
    timeout) is reported in ``errors`` and does not skip the others."""
    res = PassResult()
    try:
        res.partitions_created = retention.ensure_ahead(engine, now)
    except Exception as e:  # reported by the caller; the next pass retries
        res.errors.append(f"partitions: {_first_line(e)}")
    try:
        res.jobs_closed = close_stale(engine, now, policy.stale_job_s)
    except Exception as e:
        res.errors.append(f"stale jobs: {_first_line(e)}")
    try:  # raw blocks of closed windows merged into one per GPU (storage/raw_compact.py)
        res.windows_compacted = compact_windows(engine, now)
    except Exception as e:
        res.errors.append(f"raw compaction: {_first_line(e)}")
    if retention_due:
        try:
            res.retention = retention.apply_retention(engine, now, policy.raw_days, policy.rollup_days)
        except Exception as e:
            res.errors.append(f"retention: {_first_line(e)}")
    return res


def _first_line(e: BaseException) -> str:
    s = str(e)
    return s.splitlines()[0] if s else type(e).__name__


class MaintenanceLoop:
    """``run_once`` every ``policy.interval_s`` in a daemon thread (retention every
    ``policy.retention_interval_s``); ``start``/``stop`` or a ``with`` block."""

    def __init__(self, engine: Engine, policy: Policy | None = None) -> None:
        self.engine = engine
        self.policy: Policy = policy or DefaultPolicy()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.passes = 0
        self.last: PassResult | None = None
        # Held for the whole of a pass: see hold_passes_across_fork.
        self._pass_lock = threading.Lock()

    def start(self) -> MaintenanceLoop:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="gpufleet-maintenance", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def hold_passes_across_fork(self) -> None:
        """Make every ``os.fork`` of this process wait for a running pass to end (and start none
        until the fork is done). A process that forks while this thread is inside the database
        driver hands the child a copy of the driver's mutexes as they were: SQLite's allocator
        mutex copied locked made a forked child hang for good in its first ``sqlite3.connect``
        (tests/storage/test_maintenance_fork.py stages it). Celery's prefork pool forks its
        children from the worker's main process, where this loop runs. A fork may wait one
        pass (usually well under a second; a retention pass on a big database longer)."""
        os.register_at_fork(before=self._pass_lock.acquire, after_in_parent=self._pass_lock.release,
                            after_in_child=self._pass_lock.release)

    def __enter__(self) -> MaintenanceLoop:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def _run(self) -> None:
        last_retention = float("-inf")
        while not self._stop.is_set():
            now = time.time()
            due = now - last_retention >= self.policy.retention_interval_s
            with self._pass_lock:
                res = run_once(self.engine, now, self.policy, retention_due=due)
            if due and res.retention is not None:
                last_retention = now
            for err in res.errors:  # the database may be down; try again next round
                log.warning("maintenance: %s", err)
            self.last = res
            self.passes += 1
            self._stop.wait(self.policy.interval_s)
