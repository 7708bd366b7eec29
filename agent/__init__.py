"""The per-node agent: sample GPUs, attribute them to jobs, push batches to the collector.

Installs with ``pip install gpufleet[agent]``: imports only the standard library, msgspec,
httpx, zstandard, prometheus_client and, lazily, pynvml (NVML is touched on first use, never
at import), grpcio and protobuf (Kubernetes only). Never imports collector, storage, analysis
or api. Start with ``runner.py`` (the loop) and ``docs/agent.md``.
"""
