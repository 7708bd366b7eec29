"""Wire protocol v1 round trips, and bad bodies give errors that say what is wrong."""

from __future__ import annotations

import gzip

import msgspec
import pytest

from gpufleet.protocol import (
    JSON,
    MSGPACK,
    AgentInfo,
    Batch,
    GpuInfo,
    JobInfo,
    ProtocolError,
    decode,
    decompress,
    encode,
)


def sample_batch(rows: int = 80) -> Batch:
    gpus = [GpuInfo(index=i, uuid=f"GPU-{i:04d}", model="NVIDIA H100 80GB HBM3") for i in range(8)]
    return Batch(
        agent=AgentInfo(boot_id="b1", seq=7, node="n1"),
        gpus=gpus,
        jobs=[JobInfo(job_id="42", user="alice")],
        samples={
            "ts": [1_700_000_000.0 + i // 8 for i in range(rows)],
            "gpu": [gpus[i % 8].uuid for i in range(rows)],
            "job": ["42"] * rows,
            "sm_active": [0.5] * rows,
        },
    )


@pytest.mark.parametrize("compress", ["zstd", "gzip", None])
def test_round_trip(compress: str | None) -> None:
    b = sample_batch()
    body, headers = encode(b, compress=compress)  # type: ignore[arg-type]
    raw = decompress(body, headers.get("Content-Encoding"), max_size=10_000_000)
    out = decode(raw, headers["Content-Type"])
    assert out == b
    assert out.idempotency_key == "b1:7"
    assert out.n_rows() == 80


def test_json_body_accepted() -> None:
    b = sample_batch(8)
    out = decode(msgspec.json.encode(b), JSON)
    assert out == b


def test_unknown_top_level_field_rejected() -> None:
    body = msgspec.json.encode({"agent": {"boot_id": "b", "seq": 1, "node": "n"}, "bogus": 1})
    with pytest.raises(ProtocolError, match="bogus"):
        decode(body, JSON)


def test_wrong_version_rejected() -> None:
    body = msgspec.msgpack.encode({"agent": {"boot_id": "b", "seq": 1, "node": "n"}, "v": 2})
    with pytest.raises(ProtocolError, match="version 2"):
        decode(body, MSGPACK)


def test_garbage_and_wrong_types() -> None:
    with pytest.raises(ProtocolError, match="malformed"):
        decode(b"\xc1\xc1\xc1", MSGPACK)
    with pytest.raises(ProtocolError, match="seq"):
        decode(msgspec.json.encode({"agent": {"boot_id": "b", "seq": "x", "node": "n"}}), JSON)
    with pytest.raises(ProtocolError, match="Content-Type"):
        decode(b"{}", "text/plain")


def test_decompression_bomb_refused() -> None:
    bomb = gzip.compress(b"\0" * 5_000_000)
    with pytest.raises(ProtocolError, match="exceeds"):
        decompress(bomb, "gzip", max_size=1_000_000)
    with pytest.raises(ProtocolError, match="corrupt"):
        decompress(b"not gzip", "gzip", max_size=1_000)
    with pytest.raises(ProtocolError, match="Content-Encoding"):
        decompress(b"x", "br", max_size=1_000)
