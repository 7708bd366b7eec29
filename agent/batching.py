"""Accumulate 1 Hz cycles into one protocol ``Batch``, journaling each cycle to disk.

Every cycle is appended to ``open.journal`` (length-prefixed msgpack records) as it is
sampled, so an agent killed with SIGKILL loses at most the cycle it was in: on the next
start the journal is turned into a batch with the idempotency key it was opened with.
The journal is not fsynced per cycle (a power cut may lose up to one flush interval);
spooled batches are.
"""

from __future__ import annotations

import contextlib
import logging
import struct
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import msgspec

from gpufleet.catalog import CATALOG
from gpufleet.protocol import (
    AgentInfo,
    Allocation,
    Batch,
    CollectiveAgg,
    Event,
    GpuInfo,
    GpuNic,
    JobInfo,
    NicSample,
    ProgressWindow,
)

log = logging.getLogger(__name__)

_INT_FIELDS = frozenset(f.name for f in CATALOG.fields if f.dtype == "i8")
_FIELD_ORDER = {name: i for i, name in enumerate(CATALOG.names)}


class Row(msgspec.Struct, array_like=True):
    gpu: str
    job: str | None
    values: dict[str, float]


class CyclePart(msgspec.Struct, array_like=True, omit_defaults=True):
    """What one cycle added to the open batch (only new GPUs/jobs/allocations)."""

    ts: float
    rows: list[Row] = []
    gpus: list[GpuInfo] = []
    jobs: list[JobInfo] = []
    allocations: list[Allocation] = []
    events: list[Event] = []
    progress: list[ProgressWindow] = []  # training-progress windows the relay finished
    # NCCL collectives, NIC health, GPU <-> NIC rails (agent/sources/fabric_sections.py)
    collectives: list[CollectiveAgg] = []
    nics: list[NicSample] = []
    gpu_nics: list[GpuNic] = []


class OpenBatch:
    """The batch being built: rows in arrival order plus the GPUs, jobs and allocations seen."""

    def __init__(self, agent: AgentInfo, started: float) -> None:
        self.agent = agent
        self.started = started
        self.rows: list[tuple[float, Row]] = []
        self.gpus: dict[str, GpuInfo] = {}
        self.jobs: dict[str, JobInfo] = {}
        self.allocations: dict[tuple[str, str], Allocation] = {}
        self.events: list[Event] = []
        self.progress: list[ProgressWindow] = []
        self.collectives: list[CollectiveAgg] = []
        self.nics: list[NicSample] = []
        self.gpu_nics: dict[tuple[str, str], GpuNic] = {}

    def new_part(self, ts: float, rows: list[Row], gpus: Iterable[GpuInfo], jobs: Iterable[JobInfo],
                 allocations: Iterable[Allocation], events: list[Event],
                 progress: list[ProgressWindow] | None = None) -> CyclePart:
        """The part to journal: rows and events, plus only what this batch has not seen yet."""
        return CyclePart(
            ts=ts, rows=rows, events=events, progress=progress or [],
            gpus=[g for g in gpus if self.gpus.get(g.uuid) != g],
            jobs=[j for j in jobs if self.jobs.get(j.job_id) != j],
            allocations=[a for a in allocations if (a.gpu_uuid, a.job_id) not in self.allocations],
        )

    def add(self, part: CyclePart) -> None:
        self.rows.extend((part.ts, r) for r in part.rows)
        for g in part.gpus:
            self.gpus[g.uuid] = g
        for j in part.jobs:
            self.jobs[j.job_id] = j
        for a in part.allocations:
            self.allocations[(a.gpu_uuid, a.job_id)] = a
        self.events.extend(part.events)
        self.progress.extend(part.progress)
        self.collectives.extend(part.collectives)
        self.nics.extend(part.nics)
        self.gpu_nics.update(((g.gpu_uuid, g.nic), g) for g in part.gpu_nics)

    @property
    def n_rows(self) -> int:
        return len(self.rows)

    def empty(self) -> bool:
        return not self.rows and not self.events and not self.progress and not self.collectives and not self.nics

    def build(self, sent_at: float) -> Batch:
        present: set[str] = set()
        for _, r in self.rows:
            present.update(r.values)
        fields = sorted((f for f in present if f in _FIELD_ORDER), key=_FIELD_ORDER.__getitem__)
        cols: dict[str, list[float | int | str | None]] = {
            "ts": [ts for ts, _ in self.rows],
            "gpu": [r.gpu for _, r in self.rows],
            "job": [r.job for _, r in self.rows],
        }
        for f in fields:
            col: list[float | int | str | None] = []
            as_int = f in _INT_FIELDS
            for _, r in self.rows:
                v = r.values.get(f)
                col.append(int(v) if as_int and v is not None else v)
            cols[f] = col
        agent = msgspec.structs.replace(self.agent, sent_at=sent_at)
        return Batch(agent=agent, gpus=list(self.gpus.values()), jobs=list(self.jobs.values()),
                     allocations=list(self.allocations.values()), samples=cols if self.rows else {},
                     events=list(self.events), progress=list(self.progress), collectives=list(self.collectives),
                     nics=list(self.nics), gpu_nics=list(self.gpu_nics.values()))


# --- the journal -------------------------------------------------------------------------

_LEN = struct.Struct(">I")
_enc = msgspec.msgpack.Encoder()
_agent_dec = msgspec.msgpack.Decoder(AgentInfo)
_part_dec = msgspec.msgpack.Decoder(CyclePart)


class Journal:
    """Append-only record of the open batch: an AgentInfo record, then one CyclePart per cycle."""

    def __init__(self, path: Path, opener: Callable[..., Any] = open) -> None:
        self.path = path
        self.opener = opener  # tests put a fault-injecting file layer here
        self._f: Any = None

    def start(self, agent: AgentInfo) -> None:
        # The batch this journal covered is in the spool now, so a close that cannot flush its
        # buffer (full disk) loses nothing; the file is truncated next anyway.
        with contextlib.suppress(OSError):
            self.close()
        self._f = self.opener(self.path, "wb")
        self._write(_enc.encode(agent))

    def append(self, part: CyclePart) -> None:
        self._write(_enc.encode(part))

    def _write(self, data: bytes) -> None:
        if self._f is None:
            raise OSError(f"journal {self.path} is not open (an earlier write failed; it reopens with the next batch)")
        try:
            self._f.write(_LEN.pack(len(data)) + data)
            self._f.flush()  # into the page cache: survives the process being killed
        except (OSError, ValueError) as e:
            # The record may be torn: write nothing after it (recovery stops at a torn last
            # record), and stop journaling this batch; the next batch's start() reopens it.
            with contextlib.suppress(OSError, ValueError):
                self.close()
            self._f = None
            raise OSError(f"journal {self.path}: {e}") from e

    def close(self) -> None:
        # Forget the file before closing it: a close that fails to flush (ENOSPC) still
        # closes it, and keeping the object would turn every later write into a ValueError.
        f, self._f = self._f, None
        if f is not None:
            f.close()

    def discard(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)

    def recover(self) -> OpenBatch | None:
        """The batch a killed agent left open (complete records only), or None."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        records: list[bytes] = []
        pos = 0
        while pos + _LEN.size <= len(data):
            (n,) = _LEN.unpack_from(data, pos)
            if pos + _LEN.size + n > len(data):
                break  # the record being written when the agent died
            records.append(data[pos + _LEN.size : pos + _LEN.size + n])
            pos += _LEN.size + n
        if not records:
            return None
        try:
            agent = _agent_dec.decode(records[0])
            batch = OpenBatch(agent, started=0.0)
            for rec in records[1:]:
                batch.add(_part_dec.decode(rec))
        except msgspec.DecodeError as e:
            log.error("journal %s is unreadable (%s): set aside as %s.bad", self.path, e, self.path.name)
            self.path.replace(self.path.with_name(self.path.name + ".bad"))
            return None
        return batch
