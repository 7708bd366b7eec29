"""What a training example writes about itself (``--truth``, JSON lines), so tests and
evaluations compare gpufleet's goodput with the job's own clock: a ``start`` record, one
``span`` record per span (wall-clock start and end), and whatever the script logs (steps)."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator

from gpufleet import progress


class Truth:
    def __init__(self, path: str | None, started: float) -> None:
        self.f = open(path, "a", buffering=1) if path else None  # noqa: SIM115 - one line per record, flushed
        self.log(ev="start", t=started, pid=os.getpid())

    def log(self, **rec: object) -> None:
        if self.f is not None:
            self.f.write(json.dumps(rec) + "\n")

    @contextlib.contextmanager
    def span(self, kind: str, **extra: object) -> Iterator[None]:
        """A gpufleet.progress span, timed on the wall clock as well."""
        t0 = time.time()
        with progress.span(kind):
            yield
        self.log(ev="span", kind=kind, t0=t0, t1=time.time(), **extra)
