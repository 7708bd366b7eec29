"""A throwaway PostgreSQL instance configured the way a production write primary would be, for
the benchmarks (issue 16).

The machine's PostgreSQL service runs on the package defaults (shared_buffers 128MB,
max_wal_size 1GB, checkpoint_timeout 5min, wal_compression off): under the ingest bench it
checkpoints every few seconds ("checkpoints are occurring too frequently") and, after each
checkpoint, the first change to every page writes a full-page image into the WAL. Nobody runs a
100,000-GPU primary like that, and a bench measuring it misleads the capacity model. This module
initdb's a fresh cluster under /var/tmp, starts it on a free port with the settings of
``tuned_settings`` (durability untouched: fsync, synchronous_commit and full_page_writes stay
on, since "acknowledged after commit" is the contract) and removes it at exit, on SIGTERM/SIGHUP
too; an instance left by a killed run (its owner process gone) is removed by the next start.

    from pg_instance import admin_url
    url = admin_url("tuned")      # the process-wide tuned instance, started on first use
    url = admin_url("existing")   # the machine's service (GPUFLEET_BENCH_PG, else 127.0.0.1:5432)
    url = admin_url("postgresql://...")   # any server, as given

``server_stats(url)`` reads what a run costs that server (WAL bytes, records and full-page
images, checkpoints, the server's CPU), so a bench can report a delta around a run.

Run alone (``python bench/pg_instance.py``) it starts an instance, prints its URL and settings
and waits for Ctrl-C: a tuned server for trying things by hand.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GiB = 2**30
MiB = 2**20
PREFIX = "gpufleet-benchpg-"  # <prefix><owner pid>-<random>: how a later run tells a leftover
DEFAULT_EXISTING = "postgresql://postgres@127.0.0.1:5432/postgres"

# What a bench reports as "the settings this server ran": the write path's knobs.
REPORTED = ("shared_buffers", "max_wal_size", "min_wal_size", "checkpoint_timeout", "checkpoint_completion_target",
            "wal_compression", "wal_buffers", "wal_level", "synchronous_commit", "fsync", "full_page_writes",
            "effective_cache_size", "maintenance_work_mem", "max_connections")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] pg_instance: {msg}", file=sys.stderr, flush=True)


def bindir() -> Path:
    """The server binaries: GPUFLEET_PG_BIN, else the newest /usr/lib/postgresql/*/bin with an initdb."""
    env = os.environ.get("GPUFLEET_PG_BIN")
    if env:
        return Path(env)
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"),
                   key=lambda p: [int(x) for x in re.findall(r"\d+", p.parent.parent.name)] or [0])
    if not found:
        raise RuntimeError("no PostgreSQL server binaries (/usr/lib/postgresql/*/bin/initdb); "
                           "apt-get install postgresql, set GPUFLEET_PG_BIN, or run with --pg existing")
    return found[-1].parent


def base_dir() -> Path:
    """Where instances live: GPUFLEET_BENCH_PG_DIR, else /var/tmp (disk-backed by convention; /tmp
    is a tmpfs on many systems, and a WAL fsync to RAM would flatter every number)."""
    d = Path(os.environ.get("GPUFLEET_BENCH_PG_DIR") or ("/var/tmp" if Path("/var/tmp").is_dir()
                                                          else tempfile.gettempdir()))
    d.mkdir(parents=True, exist_ok=True)
    return d


def ram_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def supports_lz4(bin_dir: Path) -> bool:
    """wal_compression = lz4 needs a server built --with-lz4 (pg_config --configure says)."""
    pg_config = bin_dir / "pg_config"
    if not pg_config.exists():
        pg_config = Path(shutil.which("pg_config") or "pg_config")
    try:
        out = subprocess.run([str(pg_config), "--configure"], capture_output=True, text=True, timeout=30).stdout
    except OSError:
        return False
    return "--with-lz4" in out


def _size(n: int) -> str:
    """PostgreSQL's memory/size syntax in whole MB (it rejects fractions)."""
    return f"{n // MiB}MB"


def tuned_settings(ram: int, free_disk: int, lz4: bool) -> dict[str, str]:
    """Production write-primary settings for a machine with ``ram`` bytes of memory and
    ``free_disk`` bytes free where the data directory goes. Why each one: docs/capacity.md,
    "PostgreSQL settings"."""
    if free_disk < 4 * GiB:
        raise RuntimeError(f"only {free_disk / GiB:.1f} GiB free for the bench's PostgreSQL instance "
                           "(max_wal_size alone wants several GiB); free some space or use --pg existing")
    # A quarter of the disk's free space at most: the WAL between checkpoints must never be what
    # fills the disk (the tables and the other helpers' files need the rest).
    max_wal = min(16 * GiB, free_disk // 4)
    return {
        # a quarter of RAM is the usual start for a dedicated server; capped, since past ~8 GB
        # the OS page cache does the same job without double buffering
        "shared_buffers": _size(min(ram // 4, 8 * GiB)),
        "effective_cache_size": _size(ram * 3 // 4),  # planner only: what the page cache holds too
        # checkpoints spaced by time, not forced by WAL volume: each checkpoint makes the next
        # change to every page write a full-page image (8 kB) into the WAL
        "max_wal_size": _size(max_wal),
        "min_wal_size": _size(min(2 * GiB, max_wal // 4)),  # recycled segments, not new files
        "checkpoint_timeout": "15min",
        "checkpoint_completion_target": "0.9",  # spread the checkpoint's writes over its interval
        # full-page images compressed (cheap with lz4; pglz costs more CPU than it saves here)
        "wal_compression": "lz4" if lz4 else "off",
        "wal_buffers": "64MB",  # many concurrent committers: no backend waits for a WAL buffer
        "maintenance_work_mem": "512MB",  # autovacuum and index builds on the big partitions
        "max_connections": "200",  # collector workers' pools (10 + 20 overflow each) and the bench's
        # durability as in production: acknowledged means committed and flushed
        "fsync": "on", "synchronous_commit": "on", "full_page_writes": "on",
        "wal_level": "replica",  # production streams to replicas / archives WAL
        "log_checkpoints": "on",  # the log shows why each checkpoint ran (time or WAL volume)
        "listen_addresses": "127.0.0.1",
    }


def _as_postgres(args: list[str]) -> list[str]:
    if os.geteuid() == 0:  # the server refuses to run as root
        return ["runuser", "-u", "postgres", "--", *args]
    return args


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class PgInstance:
    dir: Path
    port: int
    settings: dict[str, str]
    bin: Path
    _stopped: bool = field(default=False, repr=False)

    @property
    def data(self) -> Path:
        return self.dir / "data"

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    @property
    def log_path(self) -> Path:
        return self.dir / "server.log"

    def stop(self) -> None:
        """Stop the server (fast, then immediate) and remove its directory. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        _stop_dir(self.bin, self.dir)


def _stop_dir(bin_dir: Path, d: Path) -> None:
    data = d / "data"
    if (data / "postmaster.pid").exists():
        for mode in ("fast", "immediate"):
            r = subprocess.run(_as_postgres([str(bin_dir / "pg_ctl"), "-D", str(data), "-m", mode, "-w", "-t", "60",
                                             "stop"]), capture_output=True, timeout=90)
            if r.returncode == 0:
                break
    shutil.rmtree(d, ignore_errors=True)


def remove_leftovers(root: Path, bin_dir: Path) -> int:
    """Instances whose owner process is gone (a run killed with SIGKILL): stopped and removed.
    A live owner's instance is never touched (another bench may be using it)."""
    n = 0
    for d in root.glob(f"{PREFIX}*"):
        m = re.match(rf"{PREFIX}(\d+)-", d.name)
        if not m or not d.is_dir() or _pid_alive(int(m.group(1))):
            continue
        log(f"removing a leftover instance {d} (its owner, pid {m.group(1)}, has exited)")
        _stop_dir(bin_dir, d)
        n += 1
    return n


_LIVE: list[PgInstance] = []
_HANDLERS_SET = False


def _stop_all() -> None:
    while _LIVE:
        _LIVE.pop().stop()


def _on_signal(signum: int, frame: Any) -> None:
    # SystemExit unwinds the main thread: finally blocks and context managers run, then atexit
    raise SystemExit(128 + signum)


def _install_handlers() -> None:
    global _HANDLERS_SET
    if _HANDLERS_SET:
        return
    _HANDLERS_SET = True
    atexit.register(_stop_all)
    for s in (signal.SIGTERM, signal.SIGHUP):
        # only where nobody set a handler of their own, and only from the main thread (where
        # Python delivers signals)
        with contextlib.suppress(ValueError):
            if signal.getsignal(s) is signal.SIG_DFL:
                signal.signal(s, _on_signal)


def start(settings: dict[str, str] | None = None, extra: dict[str, str] | None = None) -> PgInstance:
    """initdb + start a fresh instance with ``settings`` (default: ``tuned_settings`` for this
    machine) updated by ``extra``. Stopped and removed at exit; call ``stop()`` to do it sooner."""
    b = bindir()
    root = base_dir()
    remove_leftovers(root, b)
    if settings is None:
        settings = tuned_settings(ram_bytes(), shutil.disk_usage(root).free, supports_lz4(b))
    settings = {**settings, **(extra or {})}
    _install_handlers()
    d = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=root))
    inst = PgInstance(dir=d, port=_free_port(), settings=settings, bin=b)
    _LIVE.append(inst)
    try:
        if os.geteuid() == 0:
            shutil.chown(d, "postgres", "postgres")
        t = time.time()
        # --no-sync: initdb's own fsync of the empty cluster is not what the bench measures
        subprocess.run(_as_postgres([str(b / "initdb"), "-D", str(inst.data), "-U", "postgres", "-A", "trust",
                                     "-E", "UTF8", "--locale=C.UTF-8", "--no-sync"]),
                       check=True, capture_output=True, timeout=180)
        # the settings in postgresql.auto.conf (as ALTER SYSTEM writes them), so `show` and
        # pg_settings report them and nothing has to be quoted on a command line
        with (inst.data / "postgresql.auto.conf").open("a") as f:
            for k, v in settings.items():
                f.write(f"{k} = '{v}'\n")
        r = subprocess.run(_as_postgres([str(b / "pg_ctl"), "-D", str(inst.data), "-l", str(inst.log_path), "-w",
                                         "-t", "120", "-o", f"-p {inst.port} -k {d}", "start"]),
                           capture_output=True, text=True, timeout=180)
        if r.returncode != 0:
            tail = inst.log_path.read_text(errors="replace")[-2000:] if inst.log_path.exists() else ""
            raise RuntimeError(f"pg_ctl start failed: {r.stdout[-1000:]} {r.stderr[-1000:]} {tail}")
        log(f"tuned PostgreSQL on port {inst.port} in {d} ({time.time() - t:.1f} s): "
            + ", ".join(f"{k}={settings[k]}" for k in ("shared_buffers", "max_wal_size", "checkpoint_timeout",
                                                       "wal_compression") if k in settings))
        return inst
    except BaseException:
        _LIVE.remove(inst)
        inst.stop()
        raise


@contextlib.contextmanager
def instance(settings: dict[str, str] | None = None, extra: dict[str, str] | None = None) -> Iterator[PgInstance]:
    inst = start(settings, extra)
    try:
        yield inst
    finally:
        if inst in _LIVE:
            _LIVE.remove(inst)
        inst.stop()


_SHARED: PgInstance | None = None


def admin_url(spec: str, existing: str | None = None) -> str:
    """An admin URL for ``spec``: "tuned" (the process-wide tuned instance, started on first use,
    removed at exit), "existing" (``existing``, else GPUFLEET_BENCH_PG, else the local service)
    or a postgresql:// URL, as given."""
    global _SHARED
    if spec == "tuned":
        if _SHARED is None or _SHARED._stopped:
            _SHARED = start()
        return _SHARED.url
    if spec == "existing":
        return existing or os.environ.get("GPUFLEET_BENCH_PG") or DEFAULT_EXISTING
    if spec.startswith(("postgresql://", "postgres://", "postgresql+")):
        return spec
    raise ValueError(f"PostgreSQL server {spec!r}: expected tuned, existing or a postgresql:// URL")


# --- what a run costs the server ------------------------------------------------------------------

def _proc_cpu_ticks(pid: int, children_reaped: bool) -> int:
    with open(f"/proc/{pid}/stat") as f:
        st = f.read().rsplit(")", 1)[1].split()
    ticks = int(st[11]) + int(st[12])  # utime + stime
    if children_reaped:
        ticks += int(st[13]) + int(st[14])  # cutime + cstime: backends that exited, reaped by it
    return ticks


def process_cpu_s(pid: int) -> float:
    """CPU seconds of one process so far (utime + stime), e.g. one backend's."""
    return _proc_cpu_ticks(pid, False) / os.sysconf("SC_CLK_TCK")


def server_cpu_s(postmaster: int) -> float | None:
    """CPU seconds of one server: its postmaster, its live processes (backends, walwriter,
    checkpointer, autovacuum) and those already exited (the postmaster's reaped-children time).
    None when /proc cannot tell (a remote server): unknown, not zero."""
    tick = os.sysconf("SC_CLK_TCK")
    try:
        total = _proc_cpu_ticks(postmaster, True)
    except (OSError, IndexError, ValueError):
        return None
    for _pid, st in proc_stats():
        if int(st[1]) == postmaster:
            total += int(st[11]) + int(st[12])
    return total / tick


def proc_stats() -> Iterator[tuple[int, list[str]]]:
    """(pid, the fields of /proc/<pid>/stat after the command name: state first) of every live
    process; one that ends while being read is left out (its time is in its parent's cutime)."""
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                st = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if len(st) > 12:
            yield int(d), st


def _postmaster_of(backend: int) -> int | None:
    try:
        with open(f"/proc/{backend}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _dsn(url: str) -> str:
    """A libpq URI for psycopg from a SQLAlchemy URL (which may name a driver: postgresql+psycopg)."""
    from sqlalchemy.engine import make_url

    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def server_stats(url: str) -> dict[str, Any]:
    """A snapshot of what the server has written so far: WAL position (bytes), pg_stat_wal
    (records, full-page images, bytes), checkpoints (pg_stat_bgwriter: timed and requested, i.e.
    forced by WAL volume) and the server's CPU seconds (None if not local). Subtract two with
    ``stats_delta``. Server-wide: on a shared server every database's work is in it."""
    import psycopg

    with psycopg.connect(_dsn(url), autocommit=True) as c:
        lsn, pid = c.execute("select pg_current_wal_lsn() - '0/0'::pg_lsn, pg_backend_pid()").fetchone()  # type: ignore[misc]  # one row always
        rec, fpi, wbytes = c.execute("select wal_records, wal_fpi, wal_bytes from pg_stat_wal").fetchone()  # type: ignore[misc]  # one row always
        timed, req = c.execute("select checkpoints_timed, checkpoints_req from pg_stat_bgwriter").fetchone()  # type: ignore[misc]  # one row always
        pm = _postmaster_of(int(pid))
        cpu = server_cpu_s(pm) if pm else None
    return {"wal_lsn_bytes": int(lsn), "wal_records": int(rec), "wal_fpi": int(fpi), "wal_bytes": int(wbytes),
            "checkpoints_timed": int(timed), "checkpoints_req": int(req), "cpu_s": cpu}


def stats_delta(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """b - a per key; None where either side is unknown."""
    return {k: (b[k] - a[k] if a.get(k) is not None and b.get(k) is not None else None) for k in b}


def reported_settings(url: str) -> dict[str, str]:
    """The write-path settings the server is actually running (pg_settings, with units)."""
    import psycopg

    with psycopg.connect(_dsn(url), autocommit=True) as c:
        rows = c.execute("select name, current_setting(name) from pg_settings where name = any(%s)",
                         (list(REPORTED),)).fetchall()
        version = c.execute("show server_version").fetchone()
    out = {str(k): str(v) for k, v in rows}
    out["server_version"] = str(version[0]) if version else "?"
    return out


def main() -> int:
    with instance() as inst:
        print(inst.url)
        for k, v in reported_settings(inst.url).items():
            print(f"  {k} = {v}")
        print("Ctrl-C stops and removes it", file=sys.stderr)
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)
    return 0


if __name__ == "__main__":
    sys.exit(main())
