"""Remote-write export: the collector forwards what it stored to a configured remote-write URL
(VictoriaMetrics, Mimir, Thanos Receive, Cortex, Prometheus) through a bounded on-disk queue,
off the ingest path. docs/prometheus.md, "Export"."""
