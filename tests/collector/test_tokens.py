"""Tokens: hashed storage, roles, scoping to a node/cluster, revocation, the CLI."""

from __future__ import annotations

import hashlib
import time

import pytest
from sqlalchemy import text

from gpufleet.storage import tokens
from gpufleet.storage.db import make_engine

from .conftest import make_batch
from .test_ingest import counts, post


def test_tokens_are_stored_hashed_and_verified(engine) -> None:
    raw = tokens.create_token(engine, "n1-agent", "agent", cluster="c1", node="n1")
    with engine.connect() as c:
        stored = c.execute(text("select token_hash from api_tokens")).scalar_one()
    assert raw not in stored and stored == hashlib.sha256(raw.encode()).hexdigest()
    assert tokens.verify_token(engine, raw) == tokens.TokenInfo("n1-agent", "agent", "c1", "n1")
    assert tokens.verify_token(engine, raw + "x") is None
    assert [t["name"] for t in tokens.list_tokens(engine)] == ["n1-agent"]
    with pytest.raises(ValueError, match="already exists"):
        tokens.create_token(engine, "n1-agent", "agent")
    assert tokens.revoke_token(engine, "n1-agent") is True
    assert tokens.revoke_token(engine, "n1-agent") is False
    assert tokens.verify_token(engine, raw) is None


def test_roles(engine) -> None:
    assert tokens.role_at_least("admin", "agent") and tokens.role_at_least("agent", "agent")
    assert not tokens.role_at_least("agent", "viewer") and not tokens.role_at_least("viewer", "agent")
    assert tokens.role_at_least("operator", "viewer") and not tokens.role_at_least("viewer", "operator")
    raw = tokens.create_token(engine, "v", "viewer")
    assert tokens.authorize(engine, f"Bearer {raw}", "viewer", False).name == "v"
    with pytest.raises(tokens.AuthError) as e:
        tokens.authorize(engine, f"Bearer {raw}", "operator", False)
    assert e.value.status == 403
    with pytest.raises(tokens.AuthError) as e:
        tokens.authorize(engine, None, "viewer", False)
    assert e.value.status == 401
    assert tokens.authorize(engine, None, "admin", True) == tokens.TokenInfo("anonymous", "admin", None, None)


def test_node_token_cannot_write_another_node(database_url, live_server) -> None:
    e = make_engine(database_url)
    a = tokens.create_token(e, "a", "agent", cluster="default", node="node-a")
    cl = tokens.create_token(e, "cl", "agent", cluster="other")
    viewer = tokens.create_token(e, "v", "viewer")
    e.dispose()
    srv = live_server(database_url, allow_anonymous=False)
    now = time.time() - 30
    assert post(srv.url, make_batch("node-a", seq=0, start=now)).status_code == 401  # no token
    assert post(srv.url, make_batch("node-a", seq=0, start=now), token="gpf_nope").status_code == 401
    r = post(srv.url, make_batch("node-b", seq=0, start=now), token=a)
    assert r.status_code == 403 and "node-b" in r.json()["detail"]
    assert post(srv.url, make_batch("node-a", seq=0, start=now, cluster="other"), token=a).status_code == 403
    assert post(srv.url, make_batch("node-c", seq=0, start=now), token=cl).status_code == 403  # wrong cluster
    assert post(srv.url, make_batch("node-a", seq=0, start=now), token=viewer).status_code == 403  # cannot write
    assert counts(database_url)["raw_samples"] == 0
    assert post(srv.url, make_batch("node-a", seq=0, start=now), token=a).status_code == 200
    assert post(srv.url, make_batch("node-c", seq=0, start=now, cluster="other"), token=cl).status_code == 200
    assert counts(database_url)["raw_samples"] == 160


def test_node_cannot_claim_another_nodes_gpu(sqlite_url, live_server) -> None:
    srv = live_server(sqlite_url)
    now = time.time() - 30
    assert post(srv.url, make_batch("node-a", seq=0, start=now)).status_code == 200
    b = make_batch("node-b", seq=0, start=now)
    b.gpus[0].uuid = make_batch("node-a").gpus[0].uuid  # node-a's GPU, reported by node-b
    b.samples["gpu"] = [b.gpus[0].uuid if u == make_batch("node-b").gpus[0].uuid else u for u in b.samples["gpu"]]
    r = post(srv.url, b)
    assert r.status_code == 409 and "node-a" in r.json()["detail"]
    assert counts(sqlite_url)["raw_samples"] == 80


def test_token_cli(sqlite_url, capsys) -> None:
    from gpufleet.cli import main

    assert main(["token", "create", "n1", "--role", "agent", "--node", "n1", "--database-url", sqlite_url]) == 0
    raw = capsys.readouterr().out.strip()
    assert raw.startswith("gpf_")
    assert main(["token", "list", "--database-url", sqlite_url]) == 0
    out = capsys.readouterr().out
    assert "n1" in out and raw not in out
    e = make_engine(sqlite_url)
    assert tokens.verify_token(e, raw) is not None
    assert main(["token", "revoke", "n1", "--database-url", sqlite_url]) == 0
    tokens._cache_clear()
    assert tokens.verify_token(e, raw) is None
    assert main(["token", "revoke", "n1", "--database-url", sqlite_url]) == 1
    e.dispose()
