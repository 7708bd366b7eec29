"""Server-side settings: one typed object per process, env-overridable (GPUFLEET_*),
validated at start with messages that say what to do."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class ServerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GPUFLEET_", extra="ignore")

    database_url: str | None = None  # SQLAlchemy URL; None = SQLite under data_dir
    data_dir: Path = Path("./gpufleet-data")
    host: str = "127.0.0.1"
    port: int = 8000
    # Anonymous (token-less) access. `gpufleet up` turns it on for localhost; production
    # deployments leave it off and issue tokens with `gpufleet token create`.
    allow_anonymous: bool = False
    redis_url: str | None = None  # None = analysis runs in-process (embedded mode)
    public_url: str = ""  # base URL used in links (Slack, Grafana); defaults to http://host:port
    grafana_url: str = ""  # base URL of Grafana for drilldown links; empty hides them
    analysis_interval_s: float = Field(default=30.0, gt=0)
    max_body_bytes: int = Field(default=8 * 1024 * 1024, gt=0)
    max_rows_per_batch: int = Field(default=20_000, gt=0)

    @field_validator("port")
    @classmethod
    def _port(cls, v: int) -> int:
        if not 0 <= v <= 65535:
            raise ValueError(f"port {v} is not a TCP port (0-65535)")
        return v

    def resolved_database_url(self) -> str:
        from gpufleet.storage.db import resolve_url

        return resolve_url(self.database_url, self.data_dir)

    def base_url(self) -> str:
        return self.public_url.rstrip("/") or f"http://{self.host}:{self.port}"
