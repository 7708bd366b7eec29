"""gpufleet: cluster-wide GPU fleet telemetry and goodput service."""

__version__ = "0.1.0"
