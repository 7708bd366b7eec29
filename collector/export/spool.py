"""The export queue: a bounded directory of ready-to-send remote-write bodies (snappy), one
file per body, oldest first. It survives a restart of the collector; bounded in bytes, it
drops the OLDEST bodies when full (fresh data matters more downstream than the tail of a long
outage) and counts the samples it dropped.

The bodies at the head of the queue, up to ``hold_max`` of them, are held in memory instead
of written (``put(hold=True)`` while every queued body is held): the sender posts them within
moments, and a body the receiver acknowledges at once never touches the disk (the file's
write, read and unlink were about a quarter of the export's CPU in a running collector). When
a post fails they are written to their places in the queue (``persist``: they may now wait
long), and so are they at ``close`` (a clean stop); a body put behind a written one is written.
So only a process killed while they are posted (milliseconds; at most the posts' timeout)
loses them, at most ``hold_max`` bodies, as such a process loses the rows not yet encoded.

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
    def __init__(self, root: Path, max_bytes: int, max_workers: int = 256, hold_max: int = 8) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.hold_max = hold_max
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
        self._held: dict[Path, bytes] = {}  # bodies not written (yet): see the module's doc
        self._cv = threading.Condition(self._mu)

    def close(self) -> None:
        """Write the held bodies (a clean stop keeps what is unsent) and let the directory go."""
        self.persist()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    @staticmethod
    def _write(path: Path, body: bytes) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(body)
        os.replace(tmp, path)  # a reader never sees half a body

    def put(self, body: bytes, samples: int, hold: bool = False) -> None:
        """Queue a body; with ``hold`` it stays in memory while every body before it does (at
        most ``hold_max``)."""
        with self._mu:
            seq = self._seq
            self._seq += 1
            path = self.dir / f"{seq:016d}-{samples}{SUFFIX}"
            held = hold and len(self._held) == len(self._items) and len(self._held) < self.hold_max
            if held:
                self._held[path] = body
        if not held:
            self._write(path, body)
        item = Item(path, samples, len(body), time.time())
        with self._cv:
            self._items.append(item)
            self.bytes += item.size
            while self.bytes > self.max_bytes and len(self._items) > 1:
                old = self._items.pop(0)
                self.bytes -= old.size
                self.dropped_samples += old.samples
                if self._held.pop(old.path, None) is None:
                    old.path.unlink(missing_ok=True)
            self._cv.notify_all()

    def oldest(self, timeout: float) -> Item | None:
        with self._cv:
            if not self._items:
                self._cv.wait(timeout)
            return self._items[0] if self._items else None

    def body(self, item: Item) -> bytes | None:
        """The body's bytes; None when it is gone (dropped by the bound while the sender picked it)."""
        with self._mu:
            held = self._held.get(item.path)
        if held is not None:
            return held
        try:
            return item.path.read_bytes()
        except FileNotFoundError:
            return None

    def persist(self) -> None:
        """Write the held bodies to their places in the queue (a post failed: they may wait long)."""
        with self._mu:  # under the lock: the bound must not drop one while it is being written
            for item in [i for i in self._items if i.path in self._held]:
                self._write(item.path, self._held.pop(item.path))
            self._held.clear()  # none is left that is not queued; be exact anyway

    def done(self, item: Item) -> None:
        """Remove a body that was sent (or refused for good)."""
        with self._cv:
            if self._items and self._items[0] == item:
                self._items.pop(0)
                self.bytes -= item.size
            elif item in self._items:  # dropped and re-added can't happen; be exact anyway
                self._items.remove(item)
                self.bytes -= item.size
            if self._held.pop(item.path, None) is not None:
                return
        item.path.unlink(missing_ok=True)

    @property
    def depth(self) -> tuple[int, int, int]:
        """(files, bytes, samples) waiting."""
        with self._mu:
            return len(self._items), self.bytes, sum(i.samples for i in self._items)

    def oldest_age(self, now: float) -> float:
        with self._mu:
            return max(0.0, now - self._items[0].queued_at) if self._items else 0.0
