"""Fixtures for the Grafana tests: the generator package, a PostgreSQL database loaded once with
a simulated fleet, and a connection as Grafana's read-only role."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
DASHBOARDS = REPO / "dashboards"
if str(DASHBOARDS) not in sys.path:
    sys.path.insert(0, str(DASHBOARDS))

GRAFANA_ROLE = "gpufleet_grafana"


@pytest.fixture(scope="session")
def sim_fleet(pg_factory: Any) -> Iterator[tuple[str, Any]]:
    """(url, SimFleet): a migrated PostgreSQL database holding a simulated day of telemetry.
    Session-scoped: loading takes a few seconds and the query tests only read it."""
    import psycopg
    from sqlalchemy.engine import make_url

    from tests.progress.sim_progress import load_progress

    from .simdata import load

    url = pg_factory.migrated()
    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    # A fixed time of day (yesterday 18:00 UTC): the 6-hour panels then fall inside one daily
    # partition, whatever time the tests run at.
    now = (int(time.time()) // 86400 - 1) * 86400 + 18 * 3600
    with psycopg.connect(dsn) as conn:
        fleet = load(conn, now)
        load_progress(conn, now)  # the goodput dashboard's windows (tests/progress/sim_progress.py)
        conn.commit()
    yield dsn, fleet


@pytest.fixture(scope="session")
def grafana_conn(sim_fleet: tuple[str, Any]) -> Iterator[Any]:
    """A connection to the simulated fleet as the role Grafana uses, the way Grafana connects
    (its own login, so the role's read-only default applies). When the server does not let
    it log in without a password, the test logs in as the admin and SET ROLEs instead."""
    import psycopg
    from sqlalchemy.engine import make_url

    dsn, _ = sim_fleet
    as_role = make_url(dsn).set(username=GRAFANA_ROLE, password=None).render_as_string(hide_password=False)
    try:
        conn = psycopg.connect(as_role, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError:
        conn = psycopg.connect(dsn, autocommit=True)
        conn.execute(f"SET ROLE {GRAFANA_ROLE}")
        conn.execute("SET default_transaction_read_only = on")
    yield conn
    conn.close()
