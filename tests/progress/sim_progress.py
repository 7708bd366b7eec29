"""Progress windows for the simulated day of tests/dashboards (the goodput dashboard's panels
need rows): every job running in the last 6 hours gets up to 4 ranks reporting a window every
30 s, rank 3 about 25% slower, a checkpoint every 10 minutes. One INSERT ... SELECT."""

from __future__ import annotations

from typing import Any

SQL = """
INSERT INTO job_progress (job_pk, node_id, rank, pid, host, gpu, local_rank, world_size, start_ts, end_ts,
    steps, first_step, last_step, max_step, restarts, lost_steps, tokens, samples, productive_s, stall_s,
    unfinished_s, spans, span_counts, step_time_p50_s, step_time_p95_s, step_time_max_s, step_hist,
    last_step_ts, since_step_s, open_span, open_span_s, alive, ended, process_start, flops_per_step, params,
    dropped, events)
SELECT j.id, NULL, r.rank, 1000 + r.rank, 'host-' || (r.rank / 2), (r.rank %% 2)::text, r.rank %% 2,
       least(4, greatest(1, coalesce(j.ntasks, 4))), w.t, w.t + 10,
       st.steps, st.k * st.steps + 1, (st.k + 1) * st.steps, (st.k + 1) * st.steps, 0, 0, st.steps * 4096,
       st.steps * 8, st.steps * st.step_s, 0.0, 0.0,
       CASE WHEN st.k %% 20 = 0 THEN '{"checkpoint_save": 2.0, "data_wait": 0.5}'::json
            ELSE '{"data_wait": 0.5}'::json END,
       '{"data_wait": 1}'::json, st.step_s, st.step_s * 1.1, st.step_s * 1.2, NULL, w.t + 9.9, 0.1, NULL, NULL,
       true, false, NULL, NULL, 125000000, 0, NULL
FROM jobs j
CROSS JOIN generate_series(0, 3) AS r(rank)
CROSS JOIN LATERAL generate_series(greatest(j.start_ts, %(start)s)::bigint / 30 * 30,
                                   least(coalesce(j.end_ts, %(now)s), %(now)s)::bigint - 10, 30) AS w(t)
CROSS JOIN LATERAL (SELECT (w.t / 30)::bigint AS k, CASE WHEN r.rank = 3 THEN 0.5 ELSE 0.4 END AS step_s,
                           CASE WHEN r.rank = 3 THEN 14 ELSE 18 END AS steps) AS st
WHERE j.start_ts IS NOT NULL AND j.start_ts <= %(now)s AND coalesce(j.end_ts, %(now)s) >= %(start)s
"""


def load_progress(conn: Any, now: int, hours: float = 6.0) -> int:
    """Insert the windows in ``conn``'s transaction (psycopg); returns how many."""
    cur = conn.execute(SQL, {"start": now - int(hours * 3600), "now": now})
    return int(cur.rowcount)
