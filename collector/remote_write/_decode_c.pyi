"""The optional C pass of the remote-write decoder (_decode_c.c): see its header for the result."""

def scan(raw: bytes) -> tuple[list[bytes], bytearray, bytearray, bytearray, bytearray, list[tuple[bytes, int]],
                              bool] | None: ...
