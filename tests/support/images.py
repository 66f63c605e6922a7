"""Small real images for attachment tests, written without an imaging library."""

from __future__ import annotations

import struct
import zlib


def png(width: int = 8, height: int = 8, rgb: tuple[int, int, int] = (200, 40, 40)) -> bytes:
    """A valid, single-colour RGB PNG (browsers draw it; agents and servers can decode it)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)

    row = b"\x00" + bytes(rgb) * width
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(row * height))
        + chunk(b"IEND", b"")
    )
