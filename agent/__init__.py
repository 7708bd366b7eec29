"""The per-node agent: sample GPUs, attribute them to jobs, push batches to the collector.

Installs with ``pip install gpufleet[agent]``: imports only the standard library, msgspec,
httpx, zstandard and (lazily) pynvml. Never imports collector, storage, analysis or api.
"""
