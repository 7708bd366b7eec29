"""A fault-injecting file layer: a tiny "filesystem" with a byte capacity over a real directory.

``SmallDisk(root, capacity)`` is an ``opener`` (same signature as ``open``) for the agent's spool
and journal. Writes go through a raw file whose ``write`` accepts only what still fits under
``capacity`` (everything under ``root`` counts, as on a real filesystem), returns a short count
when the disk is nearly full and raises ``OSError(ENOSPC)`` when it is full. The raw file sits
under Python's own ``BufferedWriter``, so buffering, short writes and a ``close()`` that fails to
flush behave as on a real full disk: this is what turned the journal into "write to closed file".
Runs anywhere, no mount needed; ``tests/reliability/test_disk_full.py`` also uses a real tmpfs
where the test may mount one.
"""

from __future__ import annotations

import errno
import io
import os
from pathlib import Path
from typing import Any


def used_bytes(root: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(root):
        for name in files:
            try:
                total += os.stat(os.path.join(dirpath, name)).st_size
            except FileNotFoundError:
                pass
    return total


class _CappedRaw(io.RawIOBase):
    def __init__(self, disk: SmallDisk, path: str, mode: str) -> None:
        self.disk = disk
        self._f = io.FileIO(path, mode)

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return self._f.readable()

    def readinto(self, b: Any) -> int:
        return self._f.readinto(b)

    def write(self, b: Any) -> int:
        data = bytes(b)
        free = self.disk.free()
        if free <= 0:
            self.disk.refused += 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self._f.write(data[:free])

    def fileno(self) -> int:
        return self._f.fileno()

    def close(self) -> None:
        if not self.closed:
            self._f.close()
        super().close()


class SmallDisk:
    """``open`` over ``root`` with at most ``capacity`` bytes in use; set ``capacity`` again to
    "free space" (or fill it: ``disk.capacity = used_bytes(root)``)."""

    def __init__(self, root: Path, capacity: int) -> None:
        self.root = Path(root)
        self.capacity = capacity
        self.refused = 0

    def free(self) -> int:
        return self.capacity - used_bytes(self.root)

    def fill(self) -> None:
        """The disk is full from now on (something else took the rest)."""
        self.capacity = used_bytes(self.root)

    def __call__(self, path: os.PathLike[str] | str, mode: str = "r", *args: Any, **kw: Any) -> Any:
        if not any(c in mode for c in "wax+"):
            return open(path, mode, *args, **kw)
        raw_mode = mode.replace("b", "").replace("t", "")
        raw = _CappedRaw(self, os.fspath(path), raw_mode)
        return io.BufferedWriter(raw) if "b" in mode else io.TextIOWrapper(io.BufferedWriter(raw))
