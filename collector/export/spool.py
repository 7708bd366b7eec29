"""The export queue: a bounded directory of ready-to-send remote-write bodies (snappy), one
file per body, oldest first. It survives a restart of the collector; bounded in bytes, it
drops the OLDEST bodies when full (fresh data matters more downstream than the tail of a long
outage) and counts the samples it dropped.

Each collector process owns one subdirectory (``worker-<k>``, held with an exclusive flock), so
``serve --workers N`` processes never send the same file twice, and a restarted process adopts
the queue a previous one left behind."""

from __future__ import annotations

import fcntl
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

SUFFIX = ".rw"


@dataclass(frozen=True, slots=True)
class Item:
    path: Path
    samples: int
    size: int
    queued_at: float  # when the rows were committed (file mtime)


def _parse(path: Path) -> Item | None:
    try:
        seq_s, samples_s = path.stem.split("-")
        int(seq_s)
        st = path.stat()
        return Item(path, int(samples_s), st.st_size, st.st_mtime)
    except (ValueError, OSError):
        return None


class Spool:
    def __init__(self, root: Path, max_bytes: int, max_workers: int = 256) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self._lock_fd = -1
        for k in range(max_workers):
            d = root / f"worker-{k}"
            d.mkdir(exist_ok=True)
            fd = os.open(d / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            self.dir, self._lock_fd = d, fd
            break
        else:
            raise RuntimeError(f"export queue {root}: all {max_workers} worker directories are in use")
        self._mu = threading.Lock()
        self._items: list[Item] = sorted((i for p in self.dir.glob("*" + SUFFIX) if (i := _parse(p))),
                                         key=lambda i: i.path.name)
        for tmp in self.dir.glob("*.tmp"):  # a body half-written when the process died
            tmp.unlink(missing_ok=True)
        self._seq = int(self._items[-1].path.stem.split("-")[0]) + 1 if self._items else 0
        self.bytes = sum(i.size for i in self._items)
        self.dropped_samples = 0
        self._cv = threading.Condition(self._mu)

    def close(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def put(self, body: bytes, samples: int) -> None:
        with self._mu:
            seq = self._seq
            self._seq += 1
        path = self.dir / f"{seq:016d}-{samples}{SUFFIX}"
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(body)
        os.replace(tmp, path)  # a reader never sees half a body
        item = Item(path, samples, len(body), time.time())
        with self._cv:
            self._items.append(item)
            self.bytes += item.size
            while self.bytes > self.max_bytes and len(self._items) > 1:
                old = self._items.pop(0)
                self.bytes -= old.size
                self.dropped_samples += old.samples
                old.path.unlink(missing_ok=True)
            self._cv.notify_all()

    def oldest(self, timeout: float) -> Item | None:
        with self._cv:
            if not self._items:
                self._cv.wait(timeout)
            return self._items[0] if self._items else None

    def done(self, item: Item) -> None:
        """Remove a body that was sent (or refused for good)."""
        with self._cv:
            if self._items and self._items[0] == item:
                self._items.pop(0)
                self.bytes -= item.size
            elif item in self._items:  # dropped and re-added can't happen; be exact anyway
                self._items.remove(item)
                self.bytes -= item.size
        item.path.unlink(missing_ok=True)

    def still_queued(self, item: Item) -> bool:
        with self._mu:
            return item in self._items

    @property
    def depth(self) -> tuple[int, int, int]:
        """(files, bytes, samples) waiting."""
        with self._mu:
            return len(self._items), self.bytes, sum(i.samples for i in self._items)

    def oldest_age(self, now: float) -> float:
        with self._mu:
            return max(0.0, now - self._items[0].queued_at) if self._items else 0.0
