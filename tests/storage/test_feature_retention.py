"""Retention of the minute features folded at ingest (gpu_minute_features, job_hist_features):
kept as long as the 1-minute rollups (``rollup_days``), on SQLite and PostgreSQL. A minute goes
with the rollups' rule (its start before the cutoff); an hour's histogram only once the whole
hour is before the cutoff, so the hour holding the cutoff keeps its counts."""

from __future__ import annotations

from sqlalchemy import Engine, text

from gpufleet.storage import retention
from gpufleet.storage.db import make_engine
from tests.collector.conftest import make_batch, store

DAY = 86400
ROLLUP_DAYS = 400
HOUR0 = 1_790_000_000 // 3600 * 3600
NOW = HOUR0 + 1800 + ROLLUP_DAYS * DAY  # the cutoff falls mid-hour: HOUR0 + 30 min
CUTOFF = NOW - ROLLUP_DAYS * DAY


def _features(e: Engine) -> tuple[list[float], list[int]]:
    with e.connect() as c:
        minutes = c.execute(text("SELECT DISTINCT bucket FROM gpu_minute_features ORDER BY bucket")).scalars().all()
        hours = c.execute(text("SELECT hour FROM job_hist_features ORDER BY hour")).scalars().all()
    return [float(m) for m in minutes], [int(h) for h in hours]


def test_old_feature_rows_pruned_recent_kept(database_url: str) -> None:
    e = make_engine(database_url)
    try:
        starts = {"expired": CUTOFF - 2 * 3600, "hour_of_cutoff": CUTOFF - 600, "recent": NOW - 60}
        with e.begin() as c:
            for seq, t in enumerate(starts.values()):
                store(c, [make_batch("r1", seq=seq, start=float(t), gpus=2, seconds=10, seed=seq)], NOW)
        minutes, hours = _features(e)
        assert len(minutes) == 3 and len(hours) == 3  # each batch folded into its own minute and hour
        with e.connect() as c:
            before = c.execute(text("SELECT count(*) FROM gpu_minute_features")).scalar_one()
            kept_rows = c.execute(text("SELECT count(*) FROM gpu_minute_features WHERE bucket >= :c"),
                                  {"c": CUTOFF}).scalar_one()
        out = retention.apply_retention(e, NOW, raw_days=ROLLUP_DAYS + 10, rollup_days=ROLLUP_DAYS)
        minutes_after, hours_after = _features(e)
        # The two minutes before the cutoff are gone, the recent one kept with all its GPUs.
        assert minutes_after == [m for m in minutes if m >= CUTOFF] and len(minutes_after) == 1
        with e.connect() as c:
            assert c.execute(text("SELECT count(*) FROM gpu_minute_features")).scalar_one() == kept_rows == 2
        assert out["gpu_minute_features"] == before - kept_rows
        # The expired hour's histogram is gone; the hour holding the cutoff stays (its later
        # minutes are still kept), and the recent one.
        assert hours_after == [h for h in hours if (h + 1) * 3600 > CUTOFF] and len(hours_after) == 2
        assert out["job_hist_features"] == 1
        # Run again: nothing more to prune.
        again = retention.apply_retention(e, NOW, raw_days=ROLLUP_DAYS + 10, rollup_days=ROLLUP_DAYS)
        assert again["gpu_minute_features"] == 0 and again["job_hist_features"] == 0
        assert _features(e) == (minutes_after, hours_after)
    finally:
        e.dispose()
