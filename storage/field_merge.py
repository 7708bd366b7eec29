"""Supplement rows into the rollups and minute features: ``fold_supplements`` folds the fields
a write brought to (GPU, ts) rows stored before (``unique_rows``: a remote-write sender's
shards each carry some of a GPU's series, so one row arrives in pieces), each field sample
once, without counting the row again.

1-minute rollups (``gpu_samples_1m``, ``job_samples_1m``): the supplement's fields are rolled
up as usual and upserted with the supplement merge (``rollups._merge_sql``): ``n``,
``last_ts`` and the GPU row's ``job_pk`` unchanged, maxima merged, means weighted as rows of
the stored ``n`` that lacked the field (exact when the field is new for the minute, the
shard case).

Minute features (``gpu_minute_features``, ``job_hist_features``): the state upserted is the
difference the supplement makes to its rows, ``fold(stored + new fields) - fold(stored)``
over those rows, so every sum and count (including the cross-field ones: busy share, SM
clock while busy, throttle share, which need ``sm_active`` from the stored row) is exactly
what one request would have folded, ``n`` adds 0, and extremes merge as extremes. What a
row-local difference cannot give: when the late field is ``sm_active`` and turns a row busy,
the minute's busy-switch count and first/last busy bits would need the neighbours' bits; they
are left as stored and ``interior`` counts the minute (the marker of a switch count that may
miss switches), rather than a guessed count."""

from __future__ import annotations

import numpy as np
from sqlalchemy import Connection

from gpufleet.storage.minute_features import RULES, Folded, fold, raw_columns, upsert_folded
from gpufleet.storage.models import gpu_samples_1m, job_samples_1m
from gpufleet.storage.rollups import rollup, upsert_rollup


def fold_supplements(conn: Connection, ts: np.ndarray, gpu_pk: np.ndarray, job_pk: np.ndarray,
                     supp_vals: np.ndarray, stored_vals: np.ndarray) -> None:
    """Fold supplement rows (``supp_vals``: only the new fields, NaN elsewhere; ``stored_vals``:
    what the stored row holds; ``job_pk`` the stored row's, -1 = none) inside the caller's
    transaction."""
    if not len(ts):
        return
    k, b, n, lt, agg, carry = rollup(gpu_pk, ts, supp_vals, job_pk)
    upsert_rollup(conn, gpu_samples_1m, "gpu_pk", k, b, n, lt, agg, carry, supplement=True)
    rows = np.flatnonzero(job_pk >= 0)
    if not len(rows):
        return
    order = rows[np.lexsort((ts[rows], job_pk[rows]))]
    k, b, n, lt, agg, _ = rollup(job_pk, ts, supp_vals, None, order=order)
    upsert_rollup(conn, job_samples_1m, "job_pk", k, b, n, lt, agg, None, supplement=True)
    upsert_folded(conn, feature_change(ts, gpu_pk, job_pk, supp_vals, stored_vals), supplement=True)


def feature_change(ts: np.ndarray, gpu_pk: np.ndarray, job_pk: np.ndarray, supp_vals: np.ndarray,
                   stored_vals: np.ndarray) -> Folded:
    """The minute-feature state that, upserted with the supplement merge, turns the stored
    rows' state into that of the completed rows (pure)."""
    merged = np.where(np.isnan(stored_vals), supp_vals, stored_vals)
    after = fold(ts, gpu_pk, job_pk, raw_columns(merged))
    before = fold(ts, gpu_pk, job_pk, raw_columns(stored_vals))  # same rows: the same keys, in order
    cols: dict[str, np.ndarray] = {}
    for c, rule in RULES.items():
        if rule == "add":
            cols[c] = after.cols[c] - before.cols[c]  # n: 0, the rows were counted
        elif rule == "trans":
            cols[c] = np.zeros(len(after))
        elif rule == "interior":
            # A late sm_active can only turn a row busy (a stored value is never replaced).
            cols[c] = (after.cols["nb"] > before.cols["nb"]).astype(np.float64)
        else:  # extremes, OR, first/last times and bits (inside the stored span: kept)
            cols[c] = after.cols[c]
    return Folded(after.job_pk, after.bucket, after.gpu_pk, cols, after.hist_job, after.hist_hour,
                  after.hist - before.hist)
