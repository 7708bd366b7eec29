"""Why a batch (or an import line) is refused, as a value: ``Rejection`` names the part of the
batch, the field and row, the HTTP status and a message. Every check in the collector raises
``BatchRejected`` carrying one; callers read its fields (the NDJSON import maps ``row`` back
to a line number), never its text.

The statuses are decided here and only here: protocol errors (``gpufleet.protocol``) and the
write path's refusals (``gpufleet.storage.errors``) carry a kind, not an HTTP status, and are
translated by ``from_protocol`` / ``from_refusal``."""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpufleet.protocol import ProtocolError
from gpufleet.storage.errors import WriteRefused

# Parts holding columns (``samples.sm_active[3]``) rather than lists of records (``gpus[3].uuid``).
_COLUMNAR = frozenset(("samples", "packed"))

PROTOCOL_STATUS = {"malformed": 400, "unsupported": 415, "too_large": 413}
REFUSAL_STATUS = {"conflict": 409, "unknown_reference": 422, "not_permitted": 403}


@dataclass(frozen=True, slots=True)
class Rejection:
    """One reason a batch can never be stored. ``part``: the batch section ("samples", "gpus",
    "jobs", "allocations", "events", "agent", "packed", or "body" for the request itself);
    ``field``: the column or attribute; ``row``: the sample row or list position; ``index``:
    the batch's position in a group commit or an import chunk, when known."""

    status: int
    message: str
    part: str = "body"
    field: str | None = None
    row: int | None = None
    index: int | None = None

    @property
    def where(self) -> str:
        if self.part == "body":
            return ""
        at = f"[{self.row}]" if self.row is not None else ""
        name = f".{self.field}" if self.field else ""
        return f"{self.part}{name}{at}" if self.part in _COLUMNAR else f"{self.part}{at}{name}"

    @property
    def detail(self) -> str:
        """What the client reads (``{"detail": ...}``)."""
        where = self.where
        return f"{where}: {self.message}" if where else self.message


class BatchRejected(Exception):
    """Raised with a ``Rejection``: the batch stores nothing and the client gets its status."""

    def __init__(self, rejection: Rejection) -> None:
        super().__init__(rejection.detail)
        self.rejection = rejection

    @property
    def status(self) -> int:
        return self.rejection.status

    @property
    def detail(self) -> str:
        return self.rejection.detail

    def at(self, **changes: object) -> BatchRejected:
        """The same rejection with ``changes`` (e.g. ``index=``, ``row=``) applied."""
        # **changes: field names are the caller's (index=, row=); mypy cannot check them through replace
        return BatchRejected(replace(self.rejection, **changes))  # type: ignore[arg-type]


def reject(part: str, message: str, *, field: str | None = None, row: int | None = None,
           status: int = 422) -> BatchRejected:
    return BatchRejected(Rejection(status, message, part, field, row))


def from_protocol(e: ProtocolError) -> BatchRejected:
    return BatchRejected(Rejection(PROTOCOL_STATUS[e.kind], e.message, e.part or "body", e.field, e.row))


def from_refusal(e: WriteRefused) -> BatchRejected:
    return BatchRejected(Rejection(REFUSAL_STATUS[e.kind], e.message, e.part, e.field, e.row, e.index))
