"""Migration 0013 leaves free space in the minute-feature tables' pages (PostgreSQL), so the
fold's upserts update rows in place (HOT: no new index entry); down and up again keeps the
rows; on SQLite it changes nothing."""

from __future__ import annotations

import numpy as np
from sqlalchemy import inspect, text

from gpufleet.storage.db import make_engine
from gpufleet.storage.migrate import downgrade, upgrade
from gpufleet.storage.minute_features import FEATURE_TABLE, HIST_TABLE, fold, read_states, upsert_folded

T0 = 1_790_000_040.0


def _fillfactor(conn: object, table: str) -> str | None:
    opts = conn.execute(text("SELECT reloptions FROM pg_class WHERE relname = :t"),  # type: ignore[attr-defined]
                        {"t": table}).scalar()
    return next((o for o in opts or [] if o.startswith("fillfactor=")), None)


def _fold_twice(conn: object, gpus: int) -> None:
    """Every GPU's minute state, then a second batch folded into each (the write path's steady state)."""
    for k in range(2):
        ts = np.repeat(T0 + 10 * k + np.arange(10.0), gpus)
        g = np.tile(np.arange(1, gpus + 1), 10)
        sm = np.linspace(0, 1, len(ts))
        upsert_folded(conn, fold(ts, g, np.full(len(ts), 7), {"sm_active": sm, "power_w": 300 + sm}))  # type: ignore[arg-type]


def test_fillfactor_up_down_keeps_rows(database_url: str) -> None:
    e = make_engine(database_url)
    pg = database_url.startswith("postgresql")
    try:
        with e.begin() as c:
            _fold_twice(c, 3)
            before = read_states(c, 7, -1e18, 1e18)
            if pg:
                assert _fillfactor(c, FEATURE_TABLE) == "fillfactor=70"
                assert _fillfactor(c, HIST_TABLE) == "fillfactor=50"
        downgrade(database_url, "0012")
        with e.connect() as c:
            if pg:
                assert _fillfactor(c, FEATURE_TABLE) is None
                assert _fillfactor(c, HIST_TABLE) is None
            np.testing.assert_array_equal(read_states(c, 7, -1e18, 1e18), before)
        upgrade(database_url, "head")
        with e.connect() as c:
            if pg:
                assert _fillfactor(c, FEATURE_TABLE) == "fillfactor=70"
            np.testing.assert_array_equal(read_states(c, 7, -1e18, 1e18), before)
            assert {FEATURE_TABLE, HIST_TABLE} <= set(inspect(c).get_table_names())
    finally:
        e.dispose()


def test_folds_update_in_place(pg_url: str) -> None:
    """With the free space most second folds are HOT; without it (0012) few are: full pages
    send every new row version to another page, with a new primary-key entry."""
    def hot_share(url: str) -> float:
        e = make_engine(url)
        try:
            with e.begin() as c:
                c.execute(text(f"TRUNCATE {FEATURE_TABLE}, {HIST_TABLE}"))
            with e.begin() as c:
                _fold_twice(c, 3000)
                upd, hot = c.execute(text("SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables "
                                          "WHERE relname = :t"), {"t": FEATURE_TABLE}).one()
                assert upd == 3000
                return float(hot) / upd
        finally:
            e.dispose()

    with_space = hot_share(pg_url)
    downgrade(pg_url, "0012")
    without = hot_share(pg_url)
    assert with_space > 0.3 > without, (with_space, without)
