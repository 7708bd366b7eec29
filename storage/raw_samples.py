"""Raw sample rows into ``gpu_samples`` (the wide layout: one row per GPU-second, one column
per catalog field): binary COPY on PostgreSQL, one ``executemany`` on SQLite. The seam where
the raw layout changes: a compact layout replaces ``insert_samples`` and its encoder, and
nothing else of the write path sees rows."""

from __future__ import annotations

from typing import Any

import numpy as np
from sqlalchemy import Connection

from gpufleet.storage.copy_encoding import SAMPLE_COLUMNS, copy_buffer
from gpufleet.storage.dialect import is_postgres
from gpufleet.storage.fields import IS_I8, NF

COPY_SQL = f"COPY gpu_samples ({', '.join(SAMPLE_COLUMNS)}) FROM STDIN WITH (FORMAT binary)"
_INSERT_SQL = (f"INSERT INTO gpu_samples ({', '.join(SAMPLE_COLUMNS)}) "
               f"VALUES ({', '.join('?' * len(SAMPLE_COLUMNS))})")


def insert_samples(conn: Connection, ts: np.ndarray, gpu_pk: np.ndarray, job_pk: np.ndarray, vals: np.ndarray) -> None:
    if not len(ts):
        return
    if is_postgres(conn):
        buf = copy_buffer(ts, gpu_pk, job_pk, vals)
        raw = conn.connection.driver_connection
        # the DBAPI connection is Optional in SQLAlchemy's types; set on a checked-out connection
        with raw.cursor() as cur, cur.copy(COPY_SQL) as cp:  # type: ignore[union-attr]
            cp.write(buf)
        return
    cols: list[Any] = [ts.tolist(), gpu_pk.tolist(), [None if j < 0 else j for j in job_pk.tolist()]]
    for j in range(NF):
        v = vals[j]
        nan = np.isnan(v)
        if nan.all():
            cols.append([None] * len(ts))
        elif IS_I8[j]:
            cols.append([None if x else int(y) for x, y in zip(nan.tolist(), v.tolist(), strict=True)])
        elif nan.any():
            cols.append([None if x else y for x, y in zip(nan.tolist(), v.tolist(), strict=True)])
        else:
            cols.append(v.tolist())
    conn.exec_driver_sql(_INSERT_SQL, list(zip(*cols, strict=True)))
