"""A faster decode for the common case: the body decoded with each sample column typed
(``ts`` numbers, ``gpu`` strings, ``job`` strings or null, fields numbers or null) instead of
the protocol's generic ``float | int | str | None`` cells, so no second pass is needed to
reject strings among numbers. Anything this decoder refuses goes through the generic
``protocol.decode`` + ``storage.writes.prepare`` path, which produces the precise error, so
both paths accept and reject exactly the same bodies (tests/collector/test_fastdecode.py)."""

from __future__ import annotations

import msgspec

from gpufleet import protocol
from gpufleet.protocol import Allocation, Batch, Event, GpuInfo, JobInfo
from gpufleet.storage.writes import FIELD_INDEX, Prepared, prepare_typed


class _Batch(msgspec.Struct, forbid_unknown_fields=True):
    agent: protocol.AgentInfo
    v: int = protocol.PROTOCOL_VERSION
    gpus: list[GpuInfo] = []
    jobs: list[JobInfo] = []
    allocations: list[Allocation] = []
    samples: dict[str, msgspec.Raw] = {}
    events: list[Event] = []


_TYPES = {"ts": list[float], "gpu": list[str], "job": list[str | None], "val": list[float | None]}
_decoders = {
    "msgpack": (msgspec.msgpack.Decoder(_Batch), {k: msgspec.msgpack.Decoder(t) for k, t in _TYPES.items()}),
    "json": (msgspec.json.Decoder(_Batch), {k: msgspec.json.Decoder(t) for k, t in _TYPES.items()}),
}


def decode_prepared(body: bytes, content_type: str | None) -> Prepared | None:
    """The batch as Prepared arrays, or None when the generic path must handle it (any
    decode or validation problem: it then names the field and row)."""
    ct = (content_type or protocol.MSGPACK).split(";")[0].strip().lower()
    fmt = "json" if ct == protocol.JSON else "msgpack" if ct in (
        protocol.MSGPACK, "application/x-msgpack", "application/vnd.msgpack") else None
    if fmt is None:
        return None
    top, cols = _decoders[fmt]
    try:
        b = top.decode(body)
        if b.v != protocol.PROTOCOL_VERSION:
            return None
        s = b.samples
        if s and ("ts" not in s or "gpu" not in s):
            return None
        decoded: dict[str, list] = {}
        for name, raw in s.items():
            if name == "ts":
                decoded[name] = cols["ts"].decode(raw)
            elif name == "gpu":
                decoded[name] = cols["gpu"].decode(raw)
            elif name == "job":
                decoded[name] = cols["job"].decode(raw)
            elif name in FIELD_INDEX:
                decoded[name] = cols["val"].decode(raw)
            else:
                return None
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    batch = Batch(agent=b.agent, v=b.v, gpus=b.gpus, jobs=b.jobs, allocations=b.allocations, samples={},
                  events=b.events)
    return prepare_typed(batch, decoded)
