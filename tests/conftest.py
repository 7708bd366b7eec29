"""Shared fixtures: real databases, real Redis, a real HTTP server.

PostgreSQL: ``GPUFLEET_TEST_PG_URL`` names an admin connection to a server we may create
databases on (scripts/test.sh sets it: the running service when present, else a throwaway
instance). Each test gets its own database cloned from a migrated template, and every
database this run created is dropped at the end; nothing else on the server is touched.
Redis: ``GPUFLEET_TEST_REDIS_URL``, else a throwaway ``redis-server`` on a free port.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
FIXTURES = SHARED / "fixtures"

DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/postgres"


def shared_fixture(*parts: str) -> Path:
    """A file from ../shared/fixtures; skips (saying why) when the checkout has no ../shared."""
    p = FIXTURES.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"needs {p} (../shared is absent: this checkout is outside the gpufleet workspace)")
    return p


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- PostgreSQL --------------------------------------------------------------------------

def _pg_admin_url() -> str:
    return os.environ.get("GPUFLEET_TEST_PG_URL", DEFAULT_PG)


def _pg_reachable(url: str) -> str | None:
    import psycopg

    try:
        with psycopg.connect(url, connect_timeout=3, autocommit=True) as c:
            c.execute("select 1")
        return None
    except Exception as e:  # report why, the skip/fail message carries it
        return f"{type(e).__name__}: {e}"


class PgFactory:
    """Creates throwaway databases on the test server and drops them afterwards."""

    def __init__(self, admin_url: str) -> None:
        self.admin_url = admin_url
        self.prefix = f"gpufleet_t{os.getpid()}_"
        self.created: list[str] = []
        self._template: str | None = None
        self._lock = threading.Lock()

    def _admin(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(self.admin_url, autocommit=True) as c:
            c.execute(sql)

    def url_for(self, db: str) -> str:
        from sqlalchemy.engine import make_url

        return make_url(self.admin_url).set(database=db).render_as_string(hide_password=False)

    def empty(self) -> str:
        name = self.prefix + uuid.uuid4().hex[:10]
        self._admin(f'CREATE DATABASE "{name}"')
        self.created.append(name)
        return self.url_for(name)

    def migrated(self) -> str:
        """A fresh database at Alembic head (cloned from a template migrated once)."""
        with self._lock:
            if self._template is None:
                from gpufleet.storage.migrate import upgrade

                url = self.empty()
                upgrade(url)
                self._template = url.rsplit("/", 1)[1].split("?")[0]
        name = self.prefix + uuid.uuid4().hex[:10]
        self._admin(f'CREATE DATABASE "{name}" TEMPLATE "{self._template}"')
        self.created.append(name)
        return self.url_for(name)

    def drop_all(self) -> None:
        import psycopg

        with psycopg.connect(self.admin_url, autocommit=True) as c:
            for name in reversed(self.created):
                c.execute(
                    "select pg_terminate_backend(pid) from pg_stat_activity"
                    " where datname = %s and pid <> pg_backend_pid()",
                    (name,),
                )
                c.execute(f'DROP DATABASE IF EXISTS "{name}"')
        self.created.clear()


@pytest.fixture(scope="session")
def pg_factory() -> Iterator[PgFactory]:
    url = _pg_admin_url()
    why = _pg_reachable(url)
    if why:
        msg = f"PostgreSQL not reachable at {url} ({why}); scripts/test.sh provides one"
        if os.environ.get("CI") or os.environ.get("GPUFLEET_REQUIRE_SERVICES"):
            pytest.fail(msg)
        pytest.skip(msg)
    f = PgFactory(url)
    yield f
    f.drop_all()


@pytest.fixture
def pg_url(pg_factory: PgFactory) -> str:
    """A fresh PostgreSQL database migrated to head."""
    return pg_factory.migrated()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A fresh SQLite database file migrated to head."""
    from gpufleet.storage.migrate import upgrade

    url = f"sqlite:///{tmp_path / 'gpufleet.db'}"
    upgrade(url)
    return url


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh migrated database; every test using it runs on SQLite AND PostgreSQL."""
    if request.param == "sqlite":
        return request.getfixturevalue("sqlite_url")
    return request.getfixturevalue("pg_url")


@pytest.fixture
def engine(database_url: str) -> Iterator[object]:
    from gpufleet.storage.db import make_engine

    e = make_engine(database_url)
    yield e
    e.dispose()


# --- Redis -------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    env = os.environ.get("GPUFLEET_TEST_REDIS_URL")
    if env:
        yield env
        return
    binary = shutil.which("redis-server")
    if not binary:
        msg = "redis-server is not installed; scripts/test.sh installs Debian's redis-server"
        if os.environ.get("CI") or os.environ.get("GPUFLEET_REQUIRE_SERVICES"):
            pytest.fail(msg)
        pytest.skip(msg)
    port = free_port()
    d = tempfile.mkdtemp(prefix="gpufleet-redis-")
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", d],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    deadline = time.time() + 10
    while time.time() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            break
        time.sleep(0.05)
    yield url
    proc.terminate()
    proc.wait(10)
    shutil.rmtree(d, ignore_errors=True)


# --- a real HTTP server -------------------------------------------------------------------

class LiveServer:
    """The app under uvicorn in a thread. Without ``port`` it listens on a socket bound here
    (port 0) and handed to uvicorn: a port picked by ``free_port`` and released until uvicorn
    binds it can be taken meanwhile (any outgoing connection's ephemeral port), and the
    server then never starts. ``port`` is for a test that restarts a server on the same one."""

    def __init__(self, app: object, port: int | None = None) -> None:
        import uvicorn

        self.sock: socket.socket | None = None
        if port is None:
            self.sock = socket.socket()
            self.sock.bind(("127.0.0.1", 0))
            port = int(self.sock.getsockname()[1])
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.app = app
        cfg = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(cfg)
        sockets = [self.sock] if self.sock is not None else None
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": sockets}, daemon=True)

    def start(self) -> LiveServer:
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            if time.time() > deadline or not self.thread.is_alive():
                raise RuntimeError("test server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(15)
        if self.sock is not None:
            self.sock.close()


# Short names tests use for the settings they change most, -> (section, field).
SETTING_NAMES = {
    "allow_anonymous": ("auth", "allow_anonymous"),
    "grafana_url": ("grafana", "url"),
    "public_url": ("http", "public_url"),
    "max_body_bytes": ("http", "max_body_bytes"),
    "max_rows_per_batch": ("http", "max_rows_per_batch"),
}


def make_settings(database_url: str, **changes: object) -> object:
    """The environment's Settings with this database and ``changes``: short names from
    ``SETTING_NAMES`` or ``section__field`` (``collector__queue_rows=100``)."""
    from gpufleet.settings import Settings

    sections: dict[str, dict[str, object]] = {"database": {"url": database_url}}
    for key, value in changes.items():
        section, _, field = key.partition("__")
        if not field:
            if key not in SETTING_NAMES:
                raise TypeError(f"unknown setting {key!r}: use one of {sorted(SETTING_NAMES)} or section__field")
            section, field = SETTING_NAMES[key]
        sections.setdefault(section, {})[field] = value
    return Settings.from_env().replace(**sections)


@pytest.fixture
def live_server() -> Iterator[Callable[..., LiveServer]]:
    """``live_server(database_url, **settings)`` starts the real app under uvicorn on a free
    port in a thread and returns it (``.url``; ``.app.state`` is the FastAPI app's); stopped
    after the test. It serves what ``gpufleet serve`` serves (``serving_app``: the ingest
    front); ``front=False`` serves the bare FastAPI app, to compare the two."""
    started: list[LiveServer] = []

    def start(database_url: str, *, front: bool = True, **settings: object) -> LiveServer:
        from gpufleet.server import create_app, serving_app

        settings.setdefault("allow_anonymous", True)
        s = make_settings(database_url, **settings)
        srv = LiveServer(serving_app(s) if front else create_app(s)).start()
        started.append(srv)
        return srv

    yield start
    for s in started:
        s.stop()
