"""Wire protocol v1, agent -> collector. Documented in docs/protocol.md.

A batch carries what one agent saw over one flush interval: the GPUs it knows, the jobs
and allocations it attributed, columnar samples (one list per column, all the same
length) and events. ``(agent.boot_id, agent.seq)`` is the idempotency key: a batch
retried after a lost acknowledgement is stored once.

This module needs only msgspec, so the agent installs without the server's packages.
"""

from __future__ import annotations

import gzip
import math
import sys
from array import array
from typing import Any, Literal

import msgspec

PROTOCOL_VERSION = 1
MSGPACK = "application/msgpack"
JSON = "application/json"


class AgentInfo(msgspec.Struct, forbid_unknown_fields=True):
    boot_id: str  # random per agent start; with seq the idempotency key
    seq: int  # 0, 1, 2, ... per boot_id, never reused
    node: str
    cluster: str = "default"
    version: str = ""
    sent_at: float = 0.0


class GpuInfo(msgspec.Struct, forbid_unknown_fields=True):
    index: int  # NVML index on the node; MIG instances keep the parent's index
    uuid: str  # GPU-... or MIG-...
    model: str = ""
    mig_profile: str | None = None
    parent_uuid: str | None = None
    memory_total_bytes: float | None = None


class JobInfo(msgspec.Struct, forbid_unknown_fields=True):
    job_id: str
    source: Literal["slurm", "kubernetes", "process", "import", "simulator"] = "slurm"
    user: str | None = None
    name: str | None = None
    account: str | None = None
    partition: str | None = None
    namespace: str | None = None
    num_nodes: int | None = None
    ntasks: int | None = None
    start_ts: float | None = None
    labels: dict[str, str] = {}


class Allocation(msgspec.Struct, forbid_unknown_fields=True):
    gpu_uuid: str
    job_id: str
    since: float


class Event(msgspec.Struct, forbid_unknown_fields=True):
    ts: float
    kind: Literal["xid", "ecc_dbe", "row_remap_failure", "nvlink_error", "fell_off_bus", "other"]
    gpu_uuid: str | None = None
    code: int | None = None
    message: str = ""


class ProgressWindow(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """10 s of one training process's own progress, folded by the agent's relay from what
    ``gpufleet.progress`` reported (docs/progress.md). Seconds are wall seconds of that
    process; None = not reported (unknown, never zero). Only the types are checked at decode:
    the values' bounds are the collector's intake schema (collector/intake_schema.py), which
    refuses a bad window by itself and keeps the rest of its batch."""

    job_id: str
    rank: int
    pid: int
    start: float
    end: float
    world_size: int | None = None
    local_rank: int | None = None
    gpu: str | None = None  # from CUDA_VISIBLE_DEVICES and LOCAL_RANK: uuid or index
    host: str | None = None
    steps: int = 0
    first_step: int | None = None
    last_step: int | None = None
    max_step: int | None = None
    restarts: int = 0  # step counter went back inside this process
    lost_steps: int = 0
    tokens: int | None = None
    samples: int | None = None
    productive_s: float = 0.0
    stall_s: float = 0.0  # alive, no step for far longer than usual, no span open
    unfinished_s: float = 0.0  # the step the process was in when it disappeared
    spans: dict[str, float] = {}  # outermost span seconds by kind
    span_counts: dict[str, int] = {}
    step_time_p50_s: float | None = None
    step_time_p95_s: float | None = None
    step_time_max_s: float | None = None
    step_hist: dict[str, int] = {}  # log-bucket (base 1.1) -> steps, mergeable
    last_step_ts: float | None = None
    since_step_s: float | None = None  # at the window's end
    open_span: str | None = None
    open_span_s: float | None = None
    alive: bool = True
    ended: bool = False
    process_start: float | None = None  # set in the process's first window
    flops_per_step: float | None = None
    params: int | None = None
    dropped: int = 0  # client events lost so far (buffer full, no listener)
    events: list[dict[str, Any]] = []
    events_dropped: int = 0


class Packed(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """The samples as binary columns, what agents send by default (docs/protocol.md): the
    collector turns them into arrays without a Python object per value, which is most of what
    an 80-row batch of 30 fields costs it otherwise. All numbers are little-endian."""

    n: int  # rows
    ts: bytes  # n float64
    gpus: list[str]  # the distinct GPU uuids of the rows
    gpu: bytes  # n uint16: the row's GPU, an index into ``gpus``
    fields: list[str] = []  # catalog field names, one block of ``values`` each
    values: bytes = b""  # len(fields) blocks of n float64, field after field; NaN = not available
    jobs: list[str] = []  # the distinct job ids of the rows
    job: bytes = b""  # n int32 indices into ``jobs``, -1 = no job; empty = no row has a job


class CollectiveAgg(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """NCCL collectives of one rank folded over one window (docs/nccl.md): one row per
    (communicator, rank, collective, message-size bucket). Times in microseconds, bandwidths in
    GB/s as the NCCL Inspector reports them; None = not known (never zero)."""

    ts: float  # window start, epoch seconds
    comm: str  # communicator id ("0x7f8c496ae9f661")
    rank: int
    coll: str  # AllReduce, AllGather, ReduceScatter, ...
    size_bucket: int  # message size rounded down to a power of two, bytes
    count: int
    bytes: float  # sum of message sizes
    exec_us_p50: float
    exec_us_p95: float
    exec_us_max: float
    busbw_gbs_p50: float | None = None
    window_s: float = 10.0
    job_id: str | None = None
    n_ranks: int | None = None
    n_nodes: int | None = None
    gpu_uuid: str | None = None
    pid: int | None = None
    timing_source: str = ""


class NicSample(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """One InfiniBand/RoCE port over one interval: link facts and counter increases
    (``counters``: sysfs counter name -> increase over ``interval_s``; absent = not available)."""

    ts: float
    nic: str  # "mlx5_0/1"
    interval_s: float
    link_layer: str = ""  # InfiniBand | Ethernet (RoCE)
    state: str | None = None  # ACTIVE, DOWN, ...
    rate_gbps: float | None = None
    tx_bytes_s: float | None = None
    rx_bytes_s: float | None = None
    counters: dict[str, float] = {}


class GpuNic(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """Which NIC (rail) a GPU's traffic uses, and how the agent decided (pcie | numa | node)."""

    gpu_uuid: str
    nic: str
    mode: str = "node"


class Batch(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """One flush of one agent. ``samples`` is columnar: "ts", "gpu" (uuid), "job" (id or
    None) and one column per catalog field present; every column has the same length.
    ``packed`` carries the same columns in binary form instead (never both)."""

    agent: AgentInfo
    v: int = PROTOCOL_VERSION
    gpus: list[GpuInfo] = []
    jobs: list[JobInfo] = []
    allocations: list[Allocation] = []
    samples: dict[str, list[float | int | str | None]] = {}
    events: list[Event] = []
    packed: Packed | None = None
    progress: list[ProgressWindow] = []  # optional section: training progress (docs/progress.md)
    # optional sections (docs/nccl.md): NCCL collectives, NIC health, GPU <-> NIC rails
    collectives: list[CollectiveAgg] = []
    nics: list[NicSample] = []
    gpu_nics: list[GpuNic] = []

    @property
    def idempotency_key(self) -> str:
        return f"{self.agent.boot_id}:{self.agent.seq}"

    def n_rows(self) -> int:
        if self.packed is not None:
            return self.packed.n
        ts = self.samples.get("ts")
        return len(ts) if ts is not None else 0


_LITTLE = sys.byteorder == "little"


def _le(a: array[Any]) -> bytes:
    if not _LITTLE:
        a.byteswap()
    return a.tobytes()


def _from_le(code: str, data: bytes) -> list[Any]:
    a = array(code)
    a.frombytes(data)
    if not _LITTLE:
        a.byteswap()
    return a.tolist()


def pack_samples(samples: dict[str, list[Any]]) -> Packed:
    """Columnar ``samples`` (as ``Batch.samples``) -> ``Packed``. Uses only the standard
    library: the agent installs without numpy. None becomes NaN (not available)."""
    ts = samples["ts"]
    n = len(ts)
    gpu_col = samples["gpu"]
    gpus = list(dict.fromkeys(gpu_col))
    if len(gpus) > 65535:
        raise ValueError("more than 65535 distinct GPUs in one batch")
    gidx = {u: i for i, u in enumerate(gpus)}
    job_col = samples.get("job")
    jobs: list[str] = []
    job = b""
    if job_col is not None and any(j is not None for j in job_col):
        jobs = [j for j in dict.fromkeys(job_col) if j is not None]
        jidx: dict[str | None, int] = {j: i for i, j in enumerate(jobs)}
        jidx[None] = -1
        job = _le(array("i", map(jidx.__getitem__, job_col)))
    fields = [k for k in samples if k not in ("ts", "gpu", "job")]
    vals = array("d")
    nan = math.nan
    for f in fields:
        col = samples[f]
        # Most columns have no null: then the array takes the list at C speed.
        vals.extend([nan if v is None else v for v in col] if None in col else col)
    return Packed(n=n, ts=_le(array("d", ts)), gpus=gpus, gpu=_le(array("H", map(gidx.__getitem__, gpu_col))),
                  fields=fields, values=_le(vals), jobs=jobs, job=job)


def check_packed(p: Packed, *, gpu_max: int | None = None, job_min: int | None = None,
                 job_max: int | None = None) -> None:
    """The one check of ``Packed``'s structure (lengths, field names, row indices); raises
    ProtocolError naming the part. Callers that already hold the index columns as arrays
    pass their extremes (``gpu_max``, ``job_min``/``job_max``) so nothing is decoded here
    unless one is out of range (then the first bad row is found for the message)."""
    n = p.n
    if n < 0:
        raise ProtocolError(f"{n} must not be negative", part="packed", field="n")
    for name, data, size in (("ts", p.ts, 8), ("gpu", p.gpu, 2)):
        if len(data) != size * n:
            raise ProtocolError(f"{len(data)} bytes, expected {size} x n = {size * n}", part="packed", field=name)
    if p.job and len(p.job) != 4 * n:
        raise ProtocolError(f"{len(p.job)} bytes, expected 4 x n = {4 * n} (or none)", part="packed", field="job")
    if len(p.values) != 8 * n * len(p.fields):
        raise ProtocolError(f"{len(p.values)} bytes, expected 8 x n x len(fields) = {8 * n * len(p.fields)}",
                            part="packed", field="values")
    seen: set[str] = set()
    for f in p.fields:
        if f in ("ts", "gpu", "job") or f in seen:
            raise ProtocolError(f"{f!r} {'listed twice' if f in seen else 'is not a field name'}",
                                part="packed", field="fields")
        seen.add(f)
    if n and (gpu_max is None or gpu_max >= len(p.gpus)):
        for r, i in enumerate(_from_le("H", p.gpu)):
            if i >= len(p.gpus):
                raise ProtocolError(f"index {i}, but packed.gpus has {len(p.gpus)} entries",
                                    part="packed", field="gpu", row=r)
    if n and p.job and (job_min is None or job_max is None or job_min < -1 or job_max >= len(p.jobs)):
        for r, i in enumerate(_from_le("i", p.job)):
            if not -1 <= i < len(p.jobs):
                raise ProtocolError(f"index {i}, expected -1 (none) or below {len(p.jobs)}",
                                    part="packed", field="job", row=r)


def unpack_samples(p: Packed) -> dict[str, list[Any]]:
    """``Packed`` -> columnar samples (NaN -> None), after ``check_packed``. The values
    themselves are checked by the collector like any other samples."""
    check_packed(p)
    n = p.n
    gi = _from_le("H", p.gpu)
    out: dict[str, list[Any]] = {"ts": _from_le("d", p.ts), "gpu": [p.gpus[i] for i in gi]}
    if p.job:
        out["job"] = [None if i < 0 else p.jobs[i] for i in _from_le("i", p.job)]
    else:
        out["job"] = [None] * n
    vals = _from_le("d", p.values)
    for k, f in enumerate(p.fields):
        out[f] = [None if v != v else v for v in vals[k * n:(k + 1) * n]]  # NaN -> not available
    return out


_msgpack_enc = msgspec.msgpack.Encoder()
_msgpack_dec = msgspec.msgpack.Decoder(Batch)
_json_dec = msgspec.json.Decoder(Batch)


def encode(batch: Batch, *, compress: Literal["zstd", "gzip", None] = "zstd",
           packed: bool = True) -> tuple[bytes, dict[str, str]]:
    """Serialise a batch to msgpack, compressed; returns the body and its HTTP headers. With
    ``packed`` (the default) columnar ``samples`` travel as ``Packed`` binary columns."""
    if packed and batch.samples and batch.packed is None:
        batch = msgspec.structs.replace(batch, samples={}, packed=pack_samples(batch.samples))
    body = _msgpack_enc.encode(batch)
    headers = {"Content-Type": MSGPACK}
    if compress == "zstd":
        try:
            import zstandard
        except ImportError:  # agent without zstandard: gzip is always there
            compress = "gzip"
        else:
            body = zstandard.ZstdCompressor(level=3).compress(body)
    if compress == "gzip":
        body = gzip.compress(body, compresslevel=5)
    if compress:
        headers["Content-Encoding"] = compress
    return body, headers


ProtocolErrorKind = Literal["malformed", "unsupported", "too_large"]


class ProtocolError(ValueError):
    """The body cannot be understood. A value, not a string to parse back: ``kind`` says why
    (the collector maps it to a status), ``part``/``field``/``row`` say where (None: the body)."""

    def __init__(self, message: str, *, kind: ProtocolErrorKind = "malformed", part: str | None = None,
                 field: str | None = None, row: int | None = None) -> None:
        where = f"{part}.{field}" if part and field else (part or "")
        super().__init__(f"{where}{f'[{row}]' if row is not None else ''}: {message}" if where else message)
        self.message = message
        self.kind: ProtocolErrorKind = kind
        self.part = part
        self.field = field
        self.row = row


def decompress(body: bytes, encoding: str | None, *, max_size: int) -> bytes:
    """Undo Content-Encoding, refusing to inflate past ``max_size`` (zip bombs)."""
    enc = (encoding or "identity").strip().lower()
    if enc in ("", "identity"):
        return body
    if enc == "gzip":
        import zlib

        d = zlib.decompressobj(wbits=31)
        try:
            out = d.decompress(body, max_size + 1)
        except zlib.error as e:
            raise ProtocolError(f"gzip body is corrupt: {e}") from None
        if len(out) > max_size or d.unconsumed_tail:
            raise ProtocolError(f"decompressed body exceeds {max_size} bytes", kind="too_large")
        return out
    if enc == "zstd":
        import zstandard

        try:
            with zstandard.ZstdDecompressor().stream_reader(body) as r:
                out = r.read(max_size + 1)
        except zstandard.ZstdError as e:
            raise ProtocolError(f"zstd body is corrupt: {e}") from None
        if len(out) > max_size:
            raise ProtocolError(f"decompressed body exceeds {max_size} bytes", kind="too_large")
        return out
    raise ProtocolError(f"unsupported Content-Encoding {encoding!r}: use gzip, zstd or none", kind="unsupported")


def decode(body: bytes, content_type: str | None) -> Batch:
    """Parse a (decompressed) body as msgpack or JSON into a Batch; ProtocolError on failure."""
    ct = (content_type or MSGPACK).split(";")[0].strip().lower()
    try:
        if ct in (MSGPACK, "application/x-msgpack", "application/vnd.msgpack"):
            batch = _msgpack_dec.decode(body)
        elif ct == JSON:
            batch = _json_dec.decode(body)
        else:
            raise ProtocolError(f"unsupported Content-Type {content_type!r}: use {MSGPACK} or {JSON}",
                                kind="unsupported")
    except msgspec.ValidationError as e:
        raise ProtocolError(f"invalid batch: {e}") from None
    except msgspec.DecodeError as e:
        raise ProtocolError(f"malformed body: {e}") from None
    except RecursionError:  # msgspec's decoders stop at the interpreter's recursion limit
        raise ProtocolError("malformed body: nested too deeply (a batch is at most a few levels deep)") from None
    if batch.v != PROTOCOL_VERSION:
        raise ProtocolError(f"protocol version {batch.v} not supported (this collector speaks {PROTOCOL_VERSION})")
    if batch.packed is not None:
        if batch.samples:
            raise ProtocolError("a batch carries its rows in samples or in packed, not both", part="packed")
        batch = msgspec.structs.replace(batch, samples=unpack_samples(batch.packed), packed=None)
    return batch
