"""Wire protocol v1, agent -> collector. Documented in docs/protocol.md.

A batch carries what one agent saw over one flush interval: the GPUs it knows, the jobs
and allocations it attributed, columnar samples (one list per column, all the same
length) and events. ``(agent.boot_id, agent.seq)`` is the idempotency key: a batch
retried after a lost acknowledgement is stored once.

This module needs only msgspec, so the agent installs without the server's packages.
"""

from __future__ import annotations

import gzip
from typing import Literal

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


class Batch(msgspec.Struct, forbid_unknown_fields=True):
    """One flush of one agent. ``samples`` is columnar: "ts", "gpu" (uuid), "job" (id or
    None) and one column per catalog field present; every column has the same length."""

    agent: AgentInfo
    v: int = PROTOCOL_VERSION
    gpus: list[GpuInfo] = []
    jobs: list[JobInfo] = []
    allocations: list[Allocation] = []
    samples: dict[str, list[float | int | str | None]] = {}
    events: list[Event] = []

    @property
    def idempotency_key(self) -> str:
        return f"{self.agent.boot_id}:{self.agent.seq}"

    def n_rows(self) -> int:
        ts = self.samples.get("ts")
        return len(ts) if ts is not None else 0


_msgpack_enc = msgspec.msgpack.Encoder()
_msgpack_dec = msgspec.msgpack.Decoder(Batch)
_json_dec = msgspec.json.Decoder(Batch)


def encode(batch: Batch, *, compress: Literal["zstd", "gzip", None] = "zstd") -> tuple[bytes, dict[str, str]]:
    """Serialise a batch to msgpack, compressed; returns the body and its HTTP headers."""
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


class ProtocolError(ValueError):
    """The body cannot be understood; the message says where."""


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
            raise ProtocolError(f"decompressed body exceeds {max_size} bytes")
        return out
    if enc == "zstd":
        import zstandard

        try:
            with zstandard.ZstdDecompressor().stream_reader(body) as r:
                out = r.read(max_size + 1)
        except zstandard.ZstdError as e:
            raise ProtocolError(f"zstd body is corrupt: {e}") from None
        if len(out) > max_size:
            raise ProtocolError(f"decompressed body exceeds {max_size} bytes")
        return out
    raise ProtocolError(f"unsupported Content-Encoding {encoding!r}: use gzip, zstd or none")


def decode(body: bytes, content_type: str | None) -> Batch:
    """Parse a (decompressed) body as msgpack or JSON into a Batch; ProtocolError on failure."""
    ct = (content_type or MSGPACK).split(";")[0].strip().lower()
    try:
        if ct in (MSGPACK, "application/x-msgpack", "application/vnd.msgpack"):
            batch = _msgpack_dec.decode(body)
        elif ct == JSON:
            batch = _json_dec.decode(body)
        else:
            raise ProtocolError(f"unsupported Content-Type {content_type!r}: use {MSGPACK} or {JSON}")
    except msgspec.ValidationError as e:
        raise ProtocolError(f"invalid batch: {e}") from None
    except msgspec.DecodeError as e:
        raise ProtocolError(f"malformed body: {e}") from None
    if batch.v != PROTOCOL_VERSION:
        raise ProtocolError(f"protocol version {batch.v} not supported (this collector speaks {PROTOCOL_VERSION})")
    return batch
