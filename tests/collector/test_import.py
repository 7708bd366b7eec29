"""NDJSON import: validated completely, stored in one transaction, idempotent per file."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from gpufleet.collector.ndjson import ImportError_, import_file
from gpufleet.storage.db import make_engine
from gpufleet.storage.raw_read import raw_records

from .test_ingest import counts


def write_lines(path: Path, start: float, *, nodes: int = 2, gpus: int = 2, seconds: int = 30,
                job: str | None = "imp-1", extra: dict | None = None) -> int:
    n = 0
    with path.open("w") as f:
        for s in range(seconds):
            for node in range(nodes):
                for g in range(gpus):
                    obj = {"ts": start + s, "node": f"node-{node}", "gpu": g, "job": job, "user": "bob",
                           "sm_active": 0.5 + 0.01 * g, "temp_c": 40 + s % 5, "xid_last": 0}
                    if s % 7 == 0:
                        obj.pop("temp_c")  # missing fields are null
                    f.write(json.dumps({**obj, **(extra or {})}) + "\n")
                    n += 1
    return n


def test_import_stores_everything_once(database_url, tmp_path) -> None:
    p = tmp_path / "a.ndjson"
    start = time.time() - 3600
    n = write_lines(p, start)
    e = make_engine(database_url)
    res = import_file(e, str(p), chunk_lines=37)  # many chunks, still one transaction
    assert res.stored == n == res.lines and not res.duplicate and res.nodes == 2 and res.jobs == 1
    with e.connect() as c:
        job = c.execute(text("select * from jobs")).mappings().one()
        nulls = sum(r["temp_c"] is None for r in raw_records(c))
    assert job["source"] == "import" and job["user"] == "bob" and job["state"] == "ended"
    assert job["start_ts"] == pytest.approx(start) and job["end_ts"] == pytest.approx(start + 29)
    assert nulls == 5 * 4  # seconds 0, 7, 14, 21, 28 on 4 GPUs
    again = import_file(e, str(p))
    assert again.duplicate and again.stored == 0
    assert counts(database_url)["raw_samples"] == n
    e.dispose()


@pytest.mark.parametrize(("line", "needle"), [
    ({"ts": 1.7e9, "node": "n", "gpu": 0, "sm_actve": 0.5}, "unknown field 'sm_actve'"),
    ({"ts": 1.7e9, "node": "n", "gpu": 0, "sm_active": 1.5}, "sm_active"),
    ({"ts": 1.7e9, "node": "n", "gpu": 0, "sm_active": "0.5"}, "sm_active"),
    ({"ts": "yesterday", "node": "n", "gpu": 0}, "ts"),
    ({"ts": 1.7e9, "node": "n", "gpu": -1}, "gpu"),
    ({"ts": 1.7e9, "gpu": 0}, "node"),
    ({"ts": 9e12, "node": "n", "gpu": 0}, "future"),
])
def test_one_bad_line_names_it_and_stores_nothing(database_url, tmp_path, line, needle) -> None:
    p = tmp_path / "b.ndjson"
    n = write_lines(p, time.time() - 3600)
    with p.open("a") as f:
        f.write(json.dumps(line) + "\n")
        f.write(json.dumps({"ts": time.time() - 10, "node": "node-0", "gpu": 0}) + "\n")
    e = make_engine(database_url)
    with pytest.raises(ImportError_) as err:
        import_file(e, str(p), chunk_lines=50)
    assert f"line {n + 1}" in err.value.detail and needle in err.value.detail, err.value.detail
    e.dispose()
    c = counts(database_url)
    assert c["raw_samples"] == 0 and c["jobs"] == 0 and c["nodes"] == 0


def test_not_json(sqlite_url, tmp_path) -> None:
    p = tmp_path / "c.ndjson"
    p.write_text('{"ts": 1.7e9, "node": "n", "gpu": 0}\n[1, 2]\n')
    e = make_engine(sqlite_url)
    with pytest.raises(ImportError_, match="line 2: expected a JSON object"):
        import_file(e, str(p))
    e.dispose()


def test_import_reuses_live_gpu_and_cli(sqlite_url, tmp_path, capsys) -> None:
    from gpufleet.cli import main

    from .conftest import make_batch

    e = make_engine(sqlite_url)
    from gpufleet.collector.columns import prepare
    from gpufleet.storage.writes import write_batches

    with e.begin() as c:
        b = make_batch("node-0", seq=0, start=time.time() - 7200, gpus=2, seconds=1)
        write_batches(c, [prepare(b)], time.time())
    p = tmp_path / "d.ndjson"
    n = write_lines(p, time.time() - 3600, nodes=1, job=None)
    assert main(["import", str(p), "--database-url", sqlite_url]) == 0
    assert f"stored {n} samples" in capsys.readouterr().out
    with e.connect() as c:
        assert c.execute(text("select count(*) from gpus")).scalar_one() == 2  # same GPUs, no synthetic ones
    bad = tmp_path / "e.ndjson"
    bad.write_text('{"ts": 1.7e9, "node": "n", "gpu": 0, "nope": 1}\n')
    assert main(["import", str(bad), "--database-url", sqlite_url]) == 1
    assert "line 1" in capsys.readouterr().err
    e.dispose()


def test_import_endpoint(database_url, live_server, tmp_path) -> None:
    srv = live_server(database_url)
    p = tmp_path / "f.ndjson"
    n = write_lines(p, time.time() - 3600, extra={"cluster": "west"})
    r = httpx.post(srv.url + "/api/v1/import", content=p.read_bytes(), timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["stored"] == n
    r = httpx.post(srv.url + "/api/v1/import?cluster=x", content=b'{"ts": 1.7e9, "node": "n", "gpu": 0, "q": 1}\n')
    assert r.status_code == 422 and "line 1" in r.json()["detail"]
    with make_engine(database_url).connect() as c:
        assert c.execute(text("select name from clusters order by name")).scalars().all() == ["default", "west"]
