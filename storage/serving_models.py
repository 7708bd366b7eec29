"""Serving tables (docs/serving.md): one row per replica-minute of an inference engine's own
measures, and each deployment's SLO.

``serving_minutes``: what the agent's scrape (agent/sources/serving_scrape.py) or the
remote-write receiver folded for a replica's minute (gpufleet/serving_expo.py): histograms as
bucket counts, counters as the minute's increase, gauges as the minute's mean, in one JSON column
(``measures``: measure -> number, or {"b": bounds, "c": cumulative counts, "s": sum}; +inf is
written as null). A measure the engine does not export is absent: unknown, never zero. The
replica's GPUs come from the GPU -> job attribution (``job_id``, ``gpu_uuids``).
A minute written again (an agent's retried batch) replaces the stored one.

``serving_deployments``: the SLO labels a deployment was last seen with (gpufleet.io/slo-*).
Defined on the shared ``Base`` (imported at the end of storage/models.py); migration 0016."""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, BigInteger, Double, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from gpufleet.storage.models import Base


class ServingMinuteRow(Base):
    __tablename__ = "serving_minutes"
    __table_args__ = (Index("ix_serving_minutes_minute", "minute"),)
    cluster: Mapped[str] = mapped_column(String(64), primary_key=True)
    deployment: Mapped[str] = mapped_column(String(253), primary_key=True)
    replica: Mapped[str] = mapped_column(String(253), primary_key=True)
    # epoch seconds of the minute's start (BigInteger: past 2038 an epoch second leaves a 32-bit integer)
    minute: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    engine: Mapped[str] = mapped_column(String(16))
    node: Mapped[str | None] = mapped_column(String(255))
    job_id: Mapped[str | None] = mapped_column(String(255))
    gpus: Mapped[int] = mapped_column(Integer)
    gpu_uuids: Mapped[list[str] | None] = mapped_column(JSON)
    measures: Mapped[dict[str, Any]] = mapped_column(JSON)


class ServingDeploymentRow(Base):
    __tablename__ = "serving_deployments"
    cluster: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(253), primary_key=True)
    labels: Mapped[dict[str, Any]] = mapped_column(JSON)
    updated_ts: Mapped[float] = mapped_column(Double)
