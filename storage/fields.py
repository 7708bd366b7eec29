"""The metric catalog as arrays, in catalog order: what the write path and the collector's
column checks index by field number (row ``j`` of a value matrix is field ``NAMES[j]``)."""

from __future__ import annotations

import numpy as np

from gpufleet.catalog import CATALOG

FIELDS = CATALOG.fields
NAMES: tuple[str, ...] = CATALOG.names
FIELD_INDEX = {n: i for i, n in enumerate(NAMES)}
NF = len(FIELDS)
IS_I8 = np.array([f.dtype == "i8" for f in FIELDS])
MIN = np.array([f.min for f in FIELDS])
MAX = np.array([f.max for f in FIELDS])
# Every catalog range is finite, so a range test also rejects +-inf (field_bounds_ok).
assert np.isfinite(MIN).all() and np.isfinite(MAX).all()
ROLLUP = [f.rollup for f in FIELDS]
