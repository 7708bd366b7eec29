"""Issue 38 item 6, over real HTTP on SQLite and PostgreSQL: a GPU uuid belongs to one cluster
until an admin moves it. Another cluster's token sending the same uuids (native batches or
remote write) is refused without learning the owner's node name, even after the owner has been
silent for hours; the owner's agent keeps writing; an admin moves a GPU (API and CLI) and then
the new cluster's node is its writer."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import sqlalchemy as sa

from gpufleet.storage import tokens
from gpufleet.storage.db import make_engine
from tests.collector.conftest import gpu_uuid, make_batch
from tests.collector.test_ingest import post
from tests.prometheus.captures import body
from tests.prometheus.rwclient import post as rw_post

SECRET_NODE = "node-secret-a"


def _owner(url: str, uuid: str) -> tuple[str, str]:
    e = make_engine(url)
    try:
        with e.connect() as c:
            r = c.execute(sa.text("select c.name, n.name from gpus g join nodes n on n.id = g.node_id "
                                  "join clusters c on c.id = n.cluster_id where g.uuid = :u"), {"u": uuid}).one()
    finally:
        e.dispose()
    return r[0], r[1]


def _silence(url: str, node: str, seconds: float) -> None:
    e = make_engine(url)
    try:
        with e.begin() as c:
            c.execute(sa.text("update nodes set last_seen = :t where name = :n"),
                      {"t": time.time() - seconds, "n": node})
    finally:
        e.dispose()


def test_another_clusters_token_cannot_take_a_silent_nodes_gpus(database_url: str, live_server) -> None:  # type: ignore[no-untyped-def]
    e = make_engine(database_url)
    ta = tokens.create_token(e, "agent-a", "agent", cluster="a")
    tb = tokens.create_token(e, "agent-b", "agent", cluster="b")
    admin = tokens.create_token(e, "root", "admin")
    e.dispose()
    srv = live_server(database_url, allow_anonymous=False)
    now = time.time() - 120
    a = make_batch(SECRET_NODE, cluster="a", seq=0, start=now, gpus=2, seconds=2, job=None)
    assert post(srv.url, a, token=ta).status_code == 200
    _silence(database_url, SECRET_NODE, 3 * 3600)  # far past the same-cluster move grace

    # cluster b sends the same uuids as its node "node-b1", natively ...
    b = make_batch(SECRET_NODE, cluster="b", seq=0, start=now + 10, gpus=2, seconds=1, job=None)
    b.agent.node, b.agent.boot_id = "node-b1", "boot-b1"
    r = post(srv.url, b, token=tb)
    assert r.status_code == 403 and "another cluster" in r.json()["detail"], r.text
    assert SECRET_NODE not in r.text and "node-a" not in r.text
    # ... and by remote write (one series per GPU, its node in the Hostname label)
    t0 = int((now + 20) * 1000)
    raw = body([({"__name__": "DCGM_FI_DEV_POWER_USAGE", "UUID": gpu_uuid(SECRET_NODE, 0), "gpu": "0",
                  "Hostname": "node-b2"}, [(t0, 100.0)])])
    r = rw_post(srv.url, raw, token=tb)
    assert 400 <= r.status_code < 500 and "another cluster" in r.text, r.text
    assert SECRET_NODE not in r.text
    assert {_owner(database_url, gpu_uuid(SECRET_NODE, g)) for g in (0, 1)} == {("a", SECRET_NODE)}

    # the owner's agent comes back and keeps writing
    a2 = make_batch(SECRET_NODE, cluster="a", seq=1, start=now + 30, gpus=2, seconds=2, job=None)
    assert post(srv.url, a2, token=ta).json() == {"stored": 4, "duplicate": False}

    # an admin moves GPU 0 to cluster b's node-b1: b may now write it, a may not
    moved = gpu_uuid(SECRET_NODE, 0)
    h = {"Authorization": f"Bearer {admin}"}
    assert httpx.post(f"{srv.url}/api/v1/gpus/{moved}/move", json={"cluster": "b", "node": "node-b1"},
                      headers={"Authorization": f"Bearer {ta}"}).status_code == 403, "agents do not move GPUs"
    r = httpx.post(f"{srv.url}/api/v1/gpus/{moved}/move", json={"cluster": "b", "node": "node-b1"}, headers=h)
    assert r.status_code == 200, r.text
    assert r.json() == {"uuid": moved, "from": {"cluster": "a", "node": SECRET_NODE},
                        "to": {"cluster": "b", "node": "node-b1"}}
    assert _owner(database_url, moved) == ("b", "node-b1")
    assert httpx.post(f"{srv.url}/api/v1/gpus/GPU-nope/move", json={"cluster": "b", "node": "x"},
                      headers=h).status_code == 404
    b1 = make_batch(SECRET_NODE, cluster="b", seq=1, start=now + 40, gpus=1, seconds=2, job=None)
    b1.agent.node, b1.agent.boot_id = "node-b1", "boot-b1"
    assert post(srv.url, b1, token=tb).json() == {"stored": 2, "duplicate": False}
    a3 = make_batch(SECRET_NODE, cluster="a", seq=2, start=now + 50, gpus=1, seconds=1, job=None)
    r = post(srv.url, a3, token=ta)
    assert r.status_code == 403 and "another cluster" in r.json()["detail"] and "node-b1" not in r.text, r.text

    # the CLI moves it back
    out = subprocess.run([sys.executable, "-m", "gpufleet.cli", "gpu", "move", moved, "--cluster", "a", "--node",
                          SECRET_NODE, "--database-url", database_url], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out
    assert "b/node-b1 -> a/" + SECRET_NODE in out.stdout
    assert _owner(database_url, moved) == ("a", SECRET_NODE)
