"""The optional C pass of the export encoder (_encode_c.c): see its header for the arguments."""

from typing import Any

def encode(vals: Any, ncols: int, rows: Any, order: Any, bounds: Any, ts_ms: Any,
           labels: list[list[bytes]]) -> tuple[bytes, int]: ...
