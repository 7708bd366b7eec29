"""Binary PostgreSQL array parameters built with numpy (``pg_array``, ``pg_float_values``)
and the protocol-level prepared statement that sends them (``execute_prepared``).

Why: formatting every rollup value as text (repr + join) was the largest Python cost of a
group commit. The dumpers are registered on each connection that uses them (not on
psycopg's global adapters), the first time it does."""

from __future__ import annotations

import struct
import weakref
from typing import Any

import numpy as np
from psycopg.adapt import Dumper
from psycopg.pq import Format
from sqlalchemy import Connection


class _PgArray:
    """A one-dimensional PostgreSQL array already in binary wire format (see _pg_array)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


class _Float8Array(_PgArray):
    __slots__ = ()


class _Int4Array(_PgArray):
    __slots__ = ()


class _Float8ArrayDumper(Dumper):
    format = Format.BINARY
    oid = 1022  # float8[]

    def dump(self, obj: Any) -> bytes:
        return obj.data  # type: ignore[no-any-return]  # the PgArray's buffer, bytes


class _Int4ArrayDumper(_Float8ArrayDumper):
    oid = 1007  # int4[]


_REGISTERED: weakref.WeakSet[Any] = weakref.WeakSet()  # psycopg connections that know the dumpers


def _register(raw: Any) -> None:
    if raw not in _REGISTERED:
        raw.adapters.register_dumper(_Float8Array, _Float8ArrayDumper)
        raw.adapters.register_dumper(_Int4Array, _Int4ArrayDumper)
        _REGISTERED.add(raw)
_ELEM = {False: (701, ">f8", 8), True: (23, ">i4", 4)}
_ELEM_REC = {False: np.dtype([("l", ">i4"), ("v", ">f8")]), True: np.dtype([("l", ">i4"), ("v", ">i4")])}


def pg_array(a: np.ndarray, *, integer: bool) -> _PgArray:
    """``a`` as a binary array parameter; NaN becomes NULL. Built with numpy: formatting
    every rollup value as text (repr + join) was the largest Python cost of a group commit."""
    af = np.asarray(a, dtype=np.float64)
    nan = np.isnan(af)
    oid, dt, size = _ELEM[integer]
    n = len(af)
    rec = np.empty(n, dtype=_ELEM_REC[integer])
    if not nan.any():  # the usual case: no masking, no null bitmap
        rec["l"] = size
        rec["v"] = af.astype(dt) if integer else af
        return (_Int4Array if integer else _Float8Array)(struct.pack(">iiIii", 1, 0, oid, n, 1) + rec.tobytes())
    rec["l"] = np.where(nan, -1, size)
    rec["v"] = np.where(nan, 0, af).astype(dt) if integer else af
    # a null element is its length (-1) alone: drop its value bytes
    keep = np.ones((n, 4 + size), dtype=bool)
    keep[nan, 4:] = False
    body = np.frombuffer(rec.tobytes(), dtype=np.uint8).reshape(n, 4 + size)[keep].tobytes()
    return (_Int4Array if integer else _Float8Array)(struct.pack(">iiIii", 1, 1, oid, n, 1) + body)


def pg_float_values(mat: np.ndarray) -> list[_PgArray]:
    """Every row of ``mat`` as a float8[] parameter with NaN sent as a value, never NULL: an
    array without a null bitmap is read by subscript in constant time (``array_rows``), and
    the SQL turns NaN back into NULL (every value the write path stores is finite, so a NaN
    is always "absent")."""
    rows, n = mat.shape
    rec = np.empty(mat.shape, dtype=_ELEM_REC[False])
    rec["l"] = 8
    rec["v"] = mat
    body, w = rec.tobytes(), n * 12
    head = struct.pack(">iiIii", 1, 0, 701, n, 1)
    return [_Float8Array(head + body[j * w:(j + 1) * w]) for j in range(rows)]


NAN = "'NaN'::float8"  # array_rows' null marker of a float8 column (pg_float_values)


def array_rows(types: list[str], nulls: list[str], casts: list[str]) -> str:
    """``SELECT`` of row ``i`` of each array parameter (``%b::type``, in order), one output row
    per element: the rows an upsert inserts. The parameters must be followed by the first one
    again (``with_count``), which gives the row count.

    Why not ``unnest(%b, %b, ...)``: a multi-argument unnest runs one function scan per array,
    each materialised into its own tuplestore, and on the GPU-minute upserts (55 arrays of ~400
    rows) that was ~5 us of PostgreSQL CPU per upserted row, a third of the statement; reading
    element ``i`` of a flat array without a null bitmap is constant time (~1.3 us per row for
    all 55). Hence no NULL on the wire: ``nulls[k]`` is the value that stands for NULL in
    column ``k`` (``NAN`` for ``pg_float_values``, ``-1`` for an id; "" = never null), and
    ``casts[k]`` a type to cast the element to after that ("" = none)."""
    cols = []
    for ty, null, cast in zip(types, nulls, casts, strict=True):
        e = f"(%b::{ty})[i]"
        if null:
            e = f"NULLIF({e}, {null})"
        if cast:
            e = f"{e}::{cast}"
        cols.append(e)
    return f"SELECT {', '.join(cols)} FROM generate_series(1, cardinality(%b::{types[0]})) AS i"


def with_count(params: list[Any]) -> list[Any]:
    """``params`` for an ``array_rows`` statement: the first array once more, for its length."""
    return [*params, params[0]]


def execute_prepared(conn: Connection, sql: str, params: list[Any]) -> None:
    """Run the long upsert as a protocol-level prepared statement (psycopg ``prepare=True``):
    planned once per connection by the server. Unlike SQL ``PREPARE`` it survives rolled
    back transactions, and the values travel as plain text parameters (no list dumping)."""
    raw = conn.connection.driver_connection
    _register(raw)
    with raw.cursor() as cur:  # type: ignore[union-attr]  # DBAPI connection: Optional in SQLAlchemy's types
        cur.execute(sql, params, prepare=True)


def query_prepared(conn: Connection, sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
    """``execute_prepared`` for a query: its rows. For the small lookups of every group commit
    whose parameters are ``pg_array``s (no list dumping, planned once per connection)."""
    raw = conn.connection.driver_connection
    _register(raw)
    with raw.cursor() as cur:  # type: ignore[union-attr]  # DBAPI connection: Optional in SQLAlchemy's types
        cur.execute(sql, params, prepare=True)
        rows: list[tuple[Any, ...]] = cur.fetchall()
        return rows
