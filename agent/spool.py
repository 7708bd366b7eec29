"""Durable, size-bounded on-disk spool of encoded batches, replayed oldest first.

Layout under the spool directory::

    queue/<order:016d>-<rows>.batch   one encoded batch each: a JSON header line, then the body
    open.journal                      the batch being built (see journal.py)
    dead/<name>.batch + reasons.jsonl batches the collector rejected for good, with its reason

A batch is written to a temporary name, fsynced and renamed, so a crash leaves either the
whole file or none of it. The header keeps the batch's idempotency key, so a batch sent
again after an agent restart still counts once at the collector. When the spool would grow
past ``max_bytes`` the oldest batches are deleted, counted in ``dropped_*`` and logged.

When the disk refuses a write (full, read-only, gone), the batch is kept in memory instead,
in the same queue and order, so the sender can still deliver it and sampling never stops.
That backlog is bounded by ``memory_max_bytes`` (oldest dropped first, counted like a full
spool); each later ``put`` first moves it back to disk, oldest first, once the disk has room.
A batch held in memory is lost if the process dies before that (the log says how many).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

_SUFFIX = ".batch"
MEMORY_MAX_BYTES = 64 * 1024 * 1024  # in-memory backlog while the disk refuses writes


@dataclass(frozen=True, slots=True)
class SpoolItem:
    path: Path
    order: int
    rows: int
    size: int
    data: bytes | None = None  # the whole file's bytes while the disk refuses it (held in memory)

    @property
    def in_memory(self) -> bool:
        return self.data is not None

    def read(self) -> tuple[dict[str, object], bytes]:
        """(header, body): header holds ``key`` and the HTTP ``headers`` the body needs."""
        data = self.data if self.data is not None else self.path.read_bytes()
        nl = data.index(b"\n")
        return json.loads(data[:nl]), data[nl + 1 :]


def _parse_name(name: str) -> tuple[int, int] | None:
    if not name.endswith(_SUFFIX):
        return None
    stem = name[: -len(_SUFFIX)]
    order, _, rows = stem.partition("-")
    if not (order.isdigit() and rows.isdigit()):
        return None
    return int(order), int(rows)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Spool:
    def __init__(self, directory: Path, max_bytes: int, *, fsync: bool = True,
                 on_drop: Callable[[int, int], None] | None = None, opener: Callable[..., Any] = open,
                 memory_max_bytes: int = MEMORY_MAX_BYTES,
                 on_disk_error: Callable[[OSError], None] | None = None) -> None:
        self.dir = Path(directory)
        self.queue_dir = self.dir / "queue"
        self.dead_dir = self.dir / "dead"
        self.max_bytes = max_bytes
        self.fsync = fsync
        self.opener = opener  # tests put a fault-injecting file layer here
        self.on_drop = on_drop  # (batches, rows) dropped because the spool was full
        self.memory_max_bytes = memory_max_bytes
        self.on_disk_error = on_disk_error
        self.dropped_batches = 0
        self.dropped_rows = 0
        self._lock = threading.Lock()
        self._items: list[SpoolItem] = []
        self._inflight: Path | None = None
        self._lock_fd: int | None = None
        self._next_order = 1
        self.queue_dir.mkdir(parents=True, exist_ok=True)
        self._scan()

    def lock(self) -> None:
        """Take the spool for this agent alone: two agents sharing a spool would send each
        other's batches and tear the journal. The OS drops the lock when the process dies."""
        if self._lock_fd is not None:
            return
        fd = os.open(self.dir / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "another agent"
            os.close(fd)
            raise RuntimeError(f"spool {self.dir} is in use by {holder}: give each agent its own --spool-dir") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

    @property
    def journal_path(self) -> Path:
        return self.dir / "open.journal"

    def _scan(self) -> None:
        items = []
        for p in self.queue_dir.iterdir():
            parsed = _parse_name(p.name)
            if parsed is None:
                if p.name.endswith(".tmp"):  # a write cut short by a crash: never renamed, never acknowledged
                    p.unlink(missing_ok=True)
                continue
            items.append(SpoolItem(p, parsed[0], parsed[1], p.stat().st_size))
        items.sort(key=lambda i: i.order)
        self._items = items
        if items:
            log.info("spool %s: %d batches (%d rows, %.1f MiB) left from before, replaying oldest first",
                     self.queue_dir, len(items), self.pending_rows, self.pending_bytes / 2**20)

    # --- state ---------------------------------------------------------------------------

    @property
    def pending_batches(self) -> int:
        return len(self._items)

    @property
    def pending_bytes(self) -> int:
        return sum(i.size for i in self._items)

    @property
    def pending_rows(self) -> int:
        return sum(i.rows for i in self._items)

    @property
    def memory_batches(self) -> int:
        return sum(1 for i in self._items if i.in_memory)

    @property
    def memory_bytes(self) -> int:
        return sum(i.size for i in self._items if i.in_memory)

    def _disk_bytes(self) -> int:
        return sum(i.size for i in self._items if not i.in_memory)

    def __len__(self) -> int:
        return len(self._items)

    # --- writing -------------------------------------------------------------------------

    def put(self, body: bytes, headers: dict[str, str], key: str, rows: int) -> SpoolItem | None:
        """Store one encoded batch durably (in memory while the disk refuses it); returns None
        when it alone exceeds the spool size."""
        header = json.dumps({"key": key, "headers": headers, "rows": rows, "spooled_at": time.time()}).encode()
        data = header + b"\n" + body
        size = len(data)
        with self._lock:
            if size > self.max_bytes:
                self._count_drop(1, rows)
                log.error("batch %s (%d rows, %d bytes) is larger than the whole spool (%d bytes): dropped",
                          key, rows, size, self.max_bytes)
                return None
            order = max(self._items[-1].order + 1 if self._items else 1, self._next_order)
            self._next_order = order + 1
            path = self.queue_dir / f"{order:016d}-{rows}{_SUFFIX}"
            item = SpoolItem(path, order, rows, size, data)
            self._items.append(item)
            if not self._persist_memory():
                self._bound_memory()
            return next((i for i in self._items if i.order == order), None)

    def _persist_memory(self) -> bool:
        """Write batches held in memory to disk, oldest first; False when the disk refused one
        (the rest stay in memory and are tried again on the next put)."""
        for item, data in [(i, i.data) for i in self._items if i.data is not None]:
            self._make_room(item.size, keep=item)
            try:
                self._write_file(item.path, data)
            except OSError as e:
                if self.on_disk_error:
                    self.on_disk_error(e)
                return False
            self._items = [SpoolItem(i.path, i.order, i.rows, i.size) if i is item else i for i in self._items]
        return True

    def _write_file(self, path: Path, data: bytes) -> None:
        tmp = path.with_name(path.name + ".tmp")
        try:
            self.queue_dir.mkdir(parents=True, exist_ok=True)
            with self.opener(tmp, "wb") as f:
                f.write(data)
                if self.fsync:
                    f.flush()
                    os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError:
            # A partial temp file holds on to the space that would let the next write through.
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        if self.fsync:
            fsync_dir(self.queue_dir)

    def _bound_memory(self) -> None:
        total = self.memory_bytes
        while total > self.memory_max_bytes:
            victim = next((i for i in self._items if i.in_memory and i.path != self._inflight), None)
            if victim is None:
                break
            self._items.remove(victim)
            total -= victim.size
            self._count_drop(1, victim.rows)
            log.error("disk under %s refuses writes and the in-memory backlog is full (%d bytes max): dropped "
                      "batch %s (%d rows); %d rows dropped so far", self.dir, self.memory_max_bytes,
                      victim.path.name, victim.rows, self.dropped_rows)

    def _make_room(self, size: int, keep: SpoolItem | None = None) -> None:
        total = self._disk_bytes()
        while total + size > self.max_bytes:
            victim = next((i for i in self._items if not i.in_memory and i.path != self._inflight
                           and i is not keep), None)
            if victim is None:
                break
            self._items.remove(victim)
            victim.path.unlink(missing_ok=True)
            total -= victim.size
            self._count_drop(1, victim.rows)
            log.warning("spool %s full (%d bytes max): dropped oldest batch %s (%d rows); %d dropped so far",
                        self.dir, self.max_bytes, victim.path.name, victim.rows, self.dropped_batches)

    def _count_drop(self, batches: int, rows: int) -> None:
        self.dropped_batches += batches
        self.dropped_rows += rows
        if self.on_drop:
            self.on_drop(batches, rows)

    # --- reading -------------------------------------------------------------------------

    def peek(self) -> SpoolItem | None:
        """The oldest batch, marked in flight so a full spool does not delete it mid-send."""
        with self._lock:
            if not self._items:
                return None
            item = self._items[0]
            self._inflight = item.path
            return item

    def ack(self, item: SpoolItem) -> None:
        """The collector stored it (or already had it): forget it."""
        with self._lock:
            self._remove(item)
        item.path.unlink(missing_ok=True)

    def dead_letter(self, item: SpoolItem, status: int, reason: str) -> Path:
        """Move a permanently rejected batch aside with the collector's reason (on a full disk
        only the log keeps the reason: the sender logs it)."""
        # Queue names restart when the queue empties; the time keeps dead letters apart and in order.
        target = self.dead_dir / f"{time.time_ns() // 1000:017d}-{item.path.name}"
        with self._lock:
            self._remove(item)
            try:
                header, _ = item.read()
            except (OSError, ValueError):
                header = {}
            try:
                self.dead_dir.mkdir(exist_ok=True)
                if item.data is not None:
                    target.write_bytes(item.data)
                    item.path.unlink(missing_ok=True)  # in case it reached the disk meanwhile
                else:
                    os.replace(item.path, target)
                with open(self.dead_dir / "reasons.jsonl", "a") as f:
                    f.write(json.dumps({"file": target.name, "key": header.get("key"), "rows": item.rows,
                                        "status": status, "reason": reason, "at": time.time()}) + "\n")
                self._trim_dead()
            except OSError as e:
                item.path.unlink(missing_ok=True)  # never replayed: the collector refused it for good
                log.error("could not keep dead letter %s under %s (%s)", target.name, self.dead_dir, e)
        return target

    def dead_letter_records(self, item: SpoolItem, refused: list[dict[str, object]]) -> Path:
        """Keep the side records the collector refused alone (the rest of the batch was stored):
        one JSON line each in ``refused.jsonl`` with the collector's reason and, when the batch
        can still be read, the record itself. The batch leaves the spool as acknowledged."""
        import msgspec

        from gpufleet import protocol  # the agent's own dependency (msgspec only)

        records: dict[tuple[str, int], object] = {}
        try:
            header, body = item.read()
            hdrs = header.get("headers")
            hdrs = hdrs if isinstance(hdrs, dict) else {}
            raw = protocol.decompress(body, hdrs.get("Content-Encoding"), max_size=1 << 30)
            batch = protocol.decode(raw, hdrs.get("Content-Type"))
            for r in refused:
                part, row = r.get("part"), r.get("row")
                if isinstance(part, str) and isinstance(row, int) and part in protocol.Batch.__struct_fields__:
                    section = getattr(batch, part)
                    if isinstance(section, list) and 0 <= row < len(section):
                        records[(part, row)] = msgspec.to_builtins(section[row])
        except (OSError, ValueError, KeyError):
            header = {}
        target = self.dead_dir / "refused.jsonl"
        try:
            self.dead_dir.mkdir(exist_ok=True)
            with self._lock, open(target, "a") as f:
                for r in refused:
                    rec = records.get((str(r.get("part")), r.get("row")))  # type: ignore[arg-type]
                    f.write(json.dumps({"key": header.get("key"), **r, "record": rec, "at": time.time()},
                                       default=repr) + "\n")
                if f.tell() > max(1 << 20, self.max_bytes // 8):
                    f.close()
                    lines = target.read_bytes().splitlines(keepends=True)
                    target.write_bytes(b"".join(lines[len(lines) // 2:]))
        except OSError as e:
            log.error("could not keep %d refused records under %s (%s)", len(refused), self.dead_dir, e)
        return target

    def _trim_dead(self) -> None:
        """Dead letters are for a person to look at, not to keep forever: a quarter of the spool
        bound for batches (oldest go first), and the reasons log cut to its newest half at 1 MiB."""
        limit = self.max_bytes // 4
        files = sorted(p for p in self.dead_dir.iterdir() if p.name.endswith(_SUFFIX))
        sizes = {p: p.stat().st_size for p in files}
        total = sum(sizes.values())
        for p in files[:-1]:
            if total <= limit:
                break
            total -= sizes[p]
            p.unlink(missing_ok=True)
        reasons = self.dead_dir / "reasons.jsonl"
        if reasons.stat().st_size > 1024 * 1024:
            lines = reasons.read_text().splitlines(keepends=True)
            reasons.write_text("".join(lines[len(lines) // 2 :]))

    def _remove(self, item: SpoolItem) -> None:
        # By order: the copy the sender holds may have moved from memory to disk meanwhile.
        self._items = [i for i in self._items if i.order != item.order]
        if self._inflight == item.path:
            self._inflight = None

    def release(self) -> None:
        """The send did not finish: the batch stays first in line."""
        with self._lock:
            self._inflight = None
