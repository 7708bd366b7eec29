"""The receiver's serving hook against a real PostgreSQL that cannot take the write for a while (its
table locked by another session): the finished minutes are kept, counted, and written once the
database takes them; a minute the intake checks refuse is counted and never blocks the others."""

from __future__ import annotations

from sqlalchemy import create_engine, text

from gpufleet.collector.remote_write.serving import ServingHook
from gpufleet.collector.serving_remote_write import Finished
from gpufleet.pod_jobs import PodJobs
from gpufleet.storage.db import make_engine, normalise
from gpufleet.storage.serving import read_minutes

T0 = 1_700_000_040


def _minute(k: int, replica: str = "ml/chat-0") -> Finished:
    return Finished("lab", "chat", replica, "vllm", T0 + 60 * k, {"requests": float(k), "running": 2.0}, None)


def test_minutes_are_kept_while_the_database_is_locked_and_written_after(pg_url: str) -> None:
    # the hook's sessions give up on a lock after 0.3 s (lock_not_available: a transient error)
    hooked = create_engine(normalise(pg_url), connect_args={"options": "-c lock_timeout=300"})
    hook = ServingHook(lambda: hooked, PodJobs())
    other = make_engine(pg_url)
    with other.connect() as locker:
        tx = locker.begin()
        locker.execute(text("LOCK TABLE serving_minutes IN ACCESS EXCLUSIVE MODE"))
        hook.write([_minute(0), _minute(1)])
        assert hook.store_failures == 1 and hook.unsaved() == 2 and hook.minutes["stored"] == 0
        tx.rollback()
    bad = _minute(2, replica="x" * 300)  # a name the column cannot hold: refused by the intake checks
    hook.write([bad, _minute(2)])
    assert hook.unsaved() == 0 and hook.minutes["stored"] == 3 and hook.minutes["refused"] == 1
    with other.connect() as c:
        rows = read_minutes(c, 0, 2**40)
    assert [(r.replica, r.minute, r.measures.get("requests"), r.gpus, r.gpu_uuids) for r in rows] == \
        [("ml/chat-0", T0 + 60 * k, float(k), 0, None) for k in range(3)]
    other.dispose()
    hooked.dispose()
