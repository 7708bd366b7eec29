"""NDJSON import (``gpufleet import FILE``, ``POST /api/v1/import``): one sample per line,

    {"ts": 1790000000.0, "node": "n1", "gpu": 0, "job": "123", "user": "alice",
     "cluster": null, "sm_active": 0.42, ...any catalog field...}

Nothing of a file is stored unless all of it is valid: pass 1 streams the file and validates
every line (the same ``prepare``/``check_batch`` code as ingest, in chunks, so memory stays
bounded for files of millions of lines); pass 2 streams it again and writes every chunk
inside ONE transaction. Lines become protocol batches (one per cluster/node per chunk) with
ledger keys derived from the file's hash, so importing the same file twice stores it once.

GPUs are identified by (cluster, node, index): an existing GPU there is reused (its uuid),
otherwise the import makes a stable synthetic uuid. Imported jobs get ``source="import"``,
start/end from their samples, and end (state ``ended``) when their last sample is older
than five minutes."""

from __future__ import annotations

import gzip
import hashlib
import io
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any

import msgspec
from sqlalchemy import Connection, Engine, select

from gpufleet.catalog import CATALOG
from gpufleet.collector.columns import prepare
from gpufleet.collector.errors import BatchRejected, from_refusal
from gpufleet.collector.validate import check_batch
from gpufleet.protocol import AgentInfo, Batch, GpuInfo, JobInfo
from gpufleet.storage import retention
from gpufleet.storage.errors import WriteRefused
from gpufleet.storage.jobs import close_stale_jobs
from gpufleet.storage.models import Cluster, Gpu, Node
from gpufleet.storage.prepared import Prepared
from gpufleet.storage.write_cache import WriteCache
from gpufleet.storage.writes import write_batches

KNOWN = frozenset(("ts", "node", "gpu", "job", "user", "cluster", *CATALOG.names))
CHUNK_LINES = 50_000
MAX_LINE = 64 * 1024
# Import work is bounded by lines (blank ones included: a 254 KB gzip of newlines is 254 M
# lines, minutes of CPU per pass) and by time per pass, whatever the bytes allow.
MAX_LINES = 20_000_000
MAX_SECONDS = 600.0
_decoder = msgspec.json.Decoder()


_Jobs = dict[tuple[str, str], str | None]  # (cluster, job id) -> user


class ImportError_(Exception):
    def __init__(self, detail: str, status: int = 422) -> None:
        super().__init__(detail)
        self.detail = detail
        self.status = status


@dataclass
class ImportResult:
    lines: int = 0
    stored: int = 0
    duplicate: bool = False
    jobs: int = 0
    nodes: int = 0
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"lines": self.lines, "stored": self.stored, "duplicate": self.duplicate, "jobs": self.jobs,
                "nodes": self.nodes, "seconds": round(self.seconds, 3)}


@dataclass
class _Group:
    cluster: str
    node: str
    lines: list[int] = field(default_factory=list)
    ts: list[Any] = field(default_factory=list)
    gpu: list[int] = field(default_factory=list)
    job: list[Any] = field(default_factory=list)
    cols: dict[str, list[Any]] = field(default_factory=dict)


def _open(path: str, encoding: str) -> IO[bytes]:
    f: IO[bytes] = open(path, "rb")  # noqa: SIM115 - returned to the caller's with
    if encoding == "gzip" or (encoding in ("", "identity") and path.endswith(".gz")):
        return gzip.GzipFile(fileobj=f)  # type: ignore[return-value]  # a binary stream; typeshed: BufferedIOBase
    if encoding == "zstd" or (encoding in ("", "identity") and path.endswith(".zst")):
        import zstandard

        # zstandard's reader is a binary stream without IO[bytes] in its stubs
        return zstandard.ZstdDecompressor().stream_reader(f, closefd=True)  # type: ignore[return-value]
    return f


def _read_line(reader: IO[bytes], limit: int) -> bytes:
    """The next line, newline included (b"" at the end), reading at most ``limit + 1`` bytes
    of it: a longer line is refused after that much, whatever its length (iterating a file
    would hold the whole line first; a 1 GiB line took the server to 2 GB)."""
    return reader.readline(limit + 1)


def _lines(path: str, encoding: str, max_bytes: int | None, digest: Any = None) -> Iterator[tuple[int, bytes]]:
    total = 0
    deadline = time.monotonic() + MAX_SECONDS
    with _open(path, encoding) as raw:
        # typeshed wants a RawIOBase under BufferedReader; any binary stream with read() works
        reader = io.BufferedReader(raw, 1 << 20) if not isinstance(raw, io.BufferedReader) else raw  # type: ignore[type-var]
        no = 0
        while line := _read_line(reader, MAX_LINE):
            no += 1
            if no > MAX_LINES:
                raise ImportError_(f"line {no}: more than {MAX_LINES} lines (blank ones included): split the file", 413)
            if not no & 0xFFFF and time.monotonic() > deadline:
                raise ImportError_(f"line {no}: reading the import took more than {MAX_SECONDS:.0f} s: split the "
                                   "file", 413)
            total += len(line)
            if digest is not None:
                digest.update(line)
            if max_bytes is not None and total > max_bytes:
                raise ImportError_(f"line {no}: import exceeds {max_bytes} bytes", 413)
            if len(line) > MAX_LINE:
                raise ImportError_(f"line {no}: longer than {MAX_LINE} bytes (the newline included)")
            if line.strip():
                yield no, line


def _chunks(path: str, encoding: str, default_cluster: str, max_bytes: int | None, digest: Any = None,
            chunk_lines: int = CHUNK_LINES) -> Iterator[tuple[dict[tuple[str, str], _Group], _Jobs]]:
    """Parse lines into per-(cluster, node) columnar groups of at most ``chunk_lines`` lines.
    Yields (groups, jobs: (cluster, job) -> user). Per-line shape errors raise here."""
    groups: dict[tuple[str, str], _Group] = {}
    jobs: dict[tuple[str, str], str | None] = {}
    n = 0
    for no, line in _lines(path, encoding, max_bytes, digest):
        try:
            obj = _decoder.decode(line)
        except msgspec.DecodeError as e:
            raise ImportError_(f"line {no}: not valid JSON ({e})") from None
        except RecursionError:
            raise ImportError_(f"line {no}: nested too deeply (a line is one flat JSON object)") from None
        if not isinstance(obj, dict):
            raise ImportError_(f"line {no}: expected a JSON object, got {type(obj).__name__}")
        extra = obj.keys() - KNOWN
        if extra:
            raise ImportError_(f"line {no}: unknown field {sorted(extra)[0]!r} (not in the metric catalog)")
        ts, node, gpu = obj.get("ts"), obj.get("node"), obj.get("gpu")
        if type(ts) not in (int, float):
            raise ImportError_(f"line {no}: ts: expected unix seconds (a number), got {ts!r}")
        if type(node) is not str or not node:
            raise ImportError_(f"line {no}: node: expected a non-empty string, got {node!r}")
        if type(gpu) is not int or not 0 <= gpu <= 65535:
            raise ImportError_(f"line {no}: gpu: expected a GPU index (integer 0-65535), got {gpu!r}")
        job, user, cluster = obj.get("job"), obj.get("user"), obj.get("cluster")
        for k, v in (("job", job), ("user", user), ("cluster", cluster)):
            if v is not None and type(v) is not str:
                raise ImportError_(f"line {no}: {k}: expected a string or null, got {v!r}")
        if job == "":
            raise ImportError_(f"line {no}: job: must not be empty (use null)")
        cluster = cluster or default_cluster
        g = groups.get((cluster, node))
        if g is None:
            g = groups[(cluster, node)] = _Group(cluster, node)
        m = len(g.ts)
        g.lines.append(no)
        g.ts.append(ts)
        g.gpu.append(gpu)
        g.job.append(job)
        for k, v in obj.items():
            if k in KNOWN and k not in ("ts", "node", "gpu", "job", "user", "cluster"):
                col = g.cols.get(k)
                if col is None:
                    col = g.cols[k] = [None] * m  # missing fields are null
                col.append(v)
        for col in g.cols.values():
            if len(col) == m:
                col.append(None)
        if job is not None and (cluster, job) not in jobs:
            jobs[(cluster, job)] = user
        n += 1
        if n >= chunk_lines:
            yield groups, jobs
            groups, jobs, n = {}, {}, 0
    if groups:
        yield groups, jobs


def _synthetic_uuid(cluster: str, node: str, index: int) -> str:
    return "IMPORT-" + hashlib.sha256(f"{cluster}\x00{node}\x00{index}".encode()).hexdigest()[:32]


def _batches(groups: dict[tuple[str, str], _Group], jobs: dict[tuple[str, str], str | None], boot_id: str,
             seq0: int, uuids: dict[tuple[str, str, int], tuple[str, bool]]) -> list[tuple[Batch, _Group]]:
    out = []
    for i, ((cluster, node), g) in enumerate(sorted(groups.items())):
        idx = sorted(set(g.gpu))
        gpus = [GpuInfo(index=x, uuid=uuids[(cluster, node, x)][0]) for x in idx
                if not uuids[(cluster, node, x)][1]]  # existing GPUs keep their attributes
        jids = sorted({j for j in g.job if j is not None})
        b = Batch(
            agent=AgentInfo(boot_id=boot_id, seq=seq0 + i, node=node, cluster=cluster, version="import"),
            gpus=gpus,
            jobs=[JobInfo(job_id=j, source="import", user=jobs.get((cluster, j))) for j in jids],
            samples={"ts": g.ts, "gpu": [uuids[(cluster, node, x)][0] for x in g.gpu], "job": g.job, **g.cols},
        )
        out.append((b, g))
    return out


def _line_error(e: BatchRejected, g: _Group) -> ImportError_:
    """A batch's rejection as the file's line: a sample row maps back to its line; anything
    else (a whole-batch limit) names the group's first line and node."""
    r = e.rejection
    status = r.status if r.status != 413 else 422
    if r.part == "samples" and r.row is not None and r.row < len(g.lines):
        return ImportError_(f"line {g.lines[r.row]}: {r.field}: {r.message}", status)
    return ImportError_(f"line {g.lines[0]} (node {g.node!r}): {r.detail}", status)


def _validate(b: Batch, g: _Group, now: float) -> Prepared:
    try:
        p = prepare(b)
        check_batch(b, p, now, max_rows=10**9, max_age_s=None, max_future_s=300.0)
    except BatchRejected as e:
        raise _line_error(e, g) from None
    return p


def _resolve_uuids(conn: Connection, groups: dict[tuple[str, str], _Group],
                   uuids: dict[tuple[str, str, int], tuple[str, bool]]) -> None:
    want = {(c, n, x) for (c, n), g in groups.items() for x in set(g.gpu)} - uuids.keys()
    if not want:
        return
    nodes = sorted({(c, n) for c, n, _ in want})
    for c, n in nodes:
        rows = conn.execute(select(Gpu.index, Gpu.uuid).join(Node, Node.id == Gpu.node_id)
                            .join(Cluster, Cluster.id == Node.cluster_id)
                            .where(Cluster.name == c, Node.name == n)).all()
        for index, uuid in rows:
            if (c, n, index) in want and not uuid.startswith("IMPORT-"):
                uuids[(c, n, index)] = (uuid, True)
    for k in want:
        uuids.setdefault(k, (_synthetic_uuid(*k), False))


def import_file(engine: Engine, path: str, *, cluster: str | None = None, encoding: str = "identity",
                max_bytes: int | None = None, now: float | None = None, chunk_lines: int = CHUNK_LINES) -> ImportResult:
    """Validate all of ``path``, then store it in one transaction. Raises ImportError_
    (naming the line) and stores nothing when any line is invalid."""
    t0 = time.monotonic()
    now = time.time() if now is None else now
    default_cluster = cluster or "default"
    res = ImportResult()
    digest = hashlib.sha256()
    days: set[int] = set()
    nodes: set[tuple[str, str]] = set()
    all_jobs: set[tuple[str, str]] = set()
    # Pass 1: validate everything (uuids do not matter for validation: placeholders).
    for groups, jobs in _chunks(path, encoding, default_cluster, max_bytes, digest, chunk_lines):
        fake = {(c, n, x): (_synthetic_uuid(c, n, x), False) for (c, n), g in groups.items() for x in set(g.gpu)}
        for b, g in _batches(groups, jobs, "validate", 0, fake):
            p = _validate(b, g, now)
            res.lines += p.n
            days |= retention.days_of(p.ts)
        nodes |= groups.keys()
        all_jobs |= jobs.keys()
    if res.lines == 0:
        raise ImportError_("the file holds no samples (expected one JSON object per line)", 400)
    retention.ensure_partitions(engine, days)
    boot_id = "import-" + digest.hexdigest()[:40]
    # Pass 2: the same chunks again, all written in one transaction.
    cache = WriteCache()
    seq = 0
    dup = True
    uuids: dict[tuple[str, str, int], tuple[str, bool]] = {}
    with engine.begin() as conn:
        for groups, jobs in _chunks(path, encoding, default_cluster, max_bytes, None, chunk_lines):
            _resolve_uuids(conn, groups, uuids)
            pairs = _batches(groups, jobs, boot_id, seq, uuids)
            seq += len(pairs)
            preps = [_validate(b, g, now) for b, g in pairs]
            try:
                w = write_batches(conn, preps, now, cache)
            except WriteRefused as e:
                raise _line_error(from_refusal(e), pairs[e.index or 0][1]) from None
            res.stored += w.stored
            dup = dup and w.duplicate
        close_stale_jobs(conn, now)
    res.duplicate = dup and res.stored == 0
    res.nodes = len(nodes)
    res.jobs = len(all_jobs)
    res.seconds = time.monotonic() - t0
    return res
