"""Tables for NCCL collectives and the network fabric (docs/nccl.md), on the shared ``Base`` so
migrations and the schema test see them; imported at the end of ``storage/models.py``.

* ``collective_windows``: one row per protocol ``CollectiveAgg`` (10 s of one rank's collectives of
  one communicator, collective and message-size bucket). A window may have more than one row (a
  record the Inspector dumped late comes in a later batch): readers sum ``count``/``bytes``.
* ``nic_samples``: one row per port and interval (``NicSample``): rate, state, traffic and the
  counter increases; ``xmit_wait`` and ``errors`` are pulled out of ``counters`` for queries.
* ``gpu_nics``: which NIC (rail) each GPU's traffic uses, as the node's agent last said.

None in a column = not reported (unknown, never zero).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, BigInteger, Double, ForeignKey, Index, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from gpufleet.storage.models import Base


class CollectiveWindow(Base):
    __tablename__ = "collective_windows"
    __table_args__ = (Index("ix_collective_windows_job_ts", "job_pk", "ts"),
                      Index("ix_collective_windows_node_ts", "node_id", "ts"))
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_pk: Mapped[int | None] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id"))
    gpu_pk: Mapped[int | None] = mapped_column(ForeignKey("gpus.id"))
    ts: Mapped[float] = mapped_column(Double)
    window_s: Mapped[float] = mapped_column(Double)
    comm: Mapped[str] = mapped_column(String(64))
    rank: Mapped[int] = mapped_column(Integer)
    n_ranks: Mapped[int | None] = mapped_column(Integer)
    n_nodes: Mapped[int | None] = mapped_column(Integer)
    coll: Mapped[str] = mapped_column(String(64))
    size_bucket: Mapped[int] = mapped_column(BigInteger)
    count: Mapped[int] = mapped_column(Integer)
    bytes: Mapped[float] = mapped_column(Double)
    exec_us_p50: Mapped[float] = mapped_column(Double)
    exec_us_p95: Mapped[float] = mapped_column(Double)
    exec_us_max: Mapped[float] = mapped_column(Double)
    busbw_gbs_p50: Mapped[float | None] = mapped_column(Double)
    pid: Mapped[int | None] = mapped_column(Integer)
    timing_source: Mapped[str | None] = mapped_column(String(32))


class NicSampleRow(Base):
    __tablename__ = "nic_samples"
    __table_args__ = (Index("ix_nic_samples_node_ts", "node_id", "ts"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id"))
    ts: Mapped[float] = mapped_column(Double)
    nic: Mapped[str] = mapped_column(String(64))
    interval_s: Mapped[float] = mapped_column(Double)
    link_layer: Mapped[str | None] = mapped_column(String(32))
    state: Mapped[str | None] = mapped_column(String(32))
    rate_gbps: Mapped[float | None] = mapped_column(Double)
    tx_bytes_s: Mapped[float | None] = mapped_column(Double)
    rx_bytes_s: Mapped[float | None] = mapped_column(Double)
    xmit_wait: Mapped[float | None] = mapped_column(Double)  # port_xmit_wait increase (ticks)
    errors: Mapped[float | None] = mapped_column(Double)  # sum of the error counters' increases
    counters: Mapped[dict[str, Any] | None] = mapped_column(JSON)


class GpuNicRow(Base):
    __tablename__ = "gpu_nics"
    __table_args__ = (UniqueConstraint("gpu_pk", "nic", name="uq_gpu_nics_gpu_nic"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    gpu_pk: Mapped[int] = mapped_column(ForeignKey("gpus.id", ondelete="CASCADE"))
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id"))
    nic: Mapped[str] = mapped_column(String(64))
    mode: Mapped[str] = mapped_column(String(16))
    seen_ts: Mapped[float] = mapped_column(Double)
