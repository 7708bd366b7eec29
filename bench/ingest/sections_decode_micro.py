"""In-process decode of one 80-row packed body (8 GPUs x 10 s, the ingest bench's template)
carrying what agents now send by default besides samples: ``nics`` (8 ports) and ``gpu_nics``
(8 rails). Fast path (``collector.fastdecode.decode_prepared``) against the generic path
(``protocol.decode`` + ``collector.columns.prepare``), min of 7 repeats, us per body; the
samples-only body on the fast path for reference. No HTTP, no check_batch, no database.
Run:  .venv/bin/python bench/ingest/sections_decode_micro.py"""

from __future__ import annotations

import sys
import time
import timeit
from pathlib import Path

import msgspec

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import run as bench  # noqa: E402  (the ingest bench's templates)

from gpufleet import protocol  # noqa: E402
from gpufleet.collector.columns import prepare  # noqa: E402
from gpufleet.collector.fastdecode import decode_prepared  # noqa: E402


def with_fabric(b: protocol.Batch, t: float) -> protocol.Batch:
    """One NIC sample per port and one rail per GPU, shaped like agent/sources/nic_health.py's."""
    return msgspec.structs.replace(
        b,
        nics=[protocol.NicSample(ts=t, nic=f"mlx5_{i}/1", interval_s=10.0, link_layer="InfiniBand", state="ACTIVE",
                                 rate_gbps=400.0, tx_bytes_s=1.2e10, rx_bytes_s=1.1e10,
                                 counters={"port_xmit_wait": 2.0e7, "symbol_error": 0.0, "link_downed": 0.0,
                                           "port_rcv_errors": 0.0})
              for i in range(len(b.gpus))],
        gpu_nics=[protocol.GpuNic(gpu_uuid=g.uuid, nic=f"mlx5_{i}/1", mode="pcie") for i, g in enumerate(b.gpus)])


def main() -> int:
    now = time.time()
    b = bench.Templates(8, now).batches[3]
    b.agent.boot_id = "micro-sections"
    plain = protocol.encode(b, compress=None)[0]
    body = protocol.encode(with_fabric(b, now - 1), compress=None)[0]
    fast = decode_prepared(body, protocol.MSGPACK)
    assert fast is not None and len(fast.batch.nics) == 8 and fast.n == 80, "the fast path refused the body"

    def us(f: object) -> float:
        return min(timeit.repeat(f, number=2000, repeat=7)) / 2000 * 1e6  # type: ignore[arg-type]

    print(f"{len(body)} B body (samples-only: {len(plain)} B)")
    print(f"fast path, nics+gpu_nics:    {us(lambda: decode_prepared(body, protocol.MSGPACK)):.1f} us")
    print(f"generic path, nics+gpu_nics: {us(lambda: prepare(protocol.decode(body, protocol.MSGPACK))):.1f} us")
    print(f"fast path, samples only:     {us(lambda: decode_prepared(plain, protocol.MSGPACK)):.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
