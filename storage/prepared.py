"""What the write path consumes and returns: a batch whose samples are already arrays
(``Prepared``, built and checked by the collector's ``collector.columns``), and the
per-batch outcome of a write."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gpufleet.protocol import Batch


@dataclass(slots=True)
class Prepared:
    """A batch with its samples as arrays: ``vals[j]`` is field ``NAMES[j]`` over all rows,
    NaN where the agent sent null or did not send the column."""

    batch: Batch
    ts: np.ndarray
    gpu: list[str]
    job: list[str | None]
    vals: np.ndarray
    columns: tuple[str, ...] = ()

    @property
    def n(self) -> int:
        return len(self.ts)

    @property
    def key(self) -> tuple[str, int]:
        return (self.batch.agent.boot_id, self.batch.agent.seq)


@dataclass(slots=True)
class BatchResult:
    stored: int
    duplicate: bool
    # Which of the batch's rows brought a field not stored before (``stored`` of them), when
    # not all did: the rest were copies under another batch key. None = every row (the usual
    # case). What the export forwards, so a repeated row is not sent downstream again.
    new_rows: np.ndarray | None = None


@dataclass(slots=True)
class WriteResult:
    results: list[BatchResult] = field(default_factory=list)

    @property
    def stored(self) -> int:
        return sum(r.stored for r in self.results)

    @property
    def duplicate(self) -> bool:
        return bool(self.results) and all(r.duplicate for r in self.results)
