"""Prometheus remote write: the receiver (``POST /api/v1/write``: wire, mapping, receiver,
routes) that turns dcgm-exporter series into protocol v1 batches. docs/prometheus.md."""
