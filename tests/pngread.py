"""A small PNG reader for screenshot checks (8-bit RGB/RGBA, not interlaced, as Chromium writes
them): the image's size and its pixels, so a test can count colours without an imaging library."""

from __future__ import annotations

import struct
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

SIGNATURE = b"\x89PNG\r\n\x1a\n"


@dataclass(frozen=True)
class Image:
    width: int
    height: int
    channels: int  # 3 (RGB) or 4 (RGBA)
    rows: list[bytes]  # unfiltered scanlines, width * channels bytes each

    def pixels(self) -> Counter[tuple[int, int, int]]:
        """How many pixels have each RGB colour (alpha ignored)."""
        out: Counter[tuple[int, int, int]] = Counter()
        c = self.channels
        for row in self.rows:
            out.update(zip(row[0::c], row[1::c], row[2::c], strict=True))
        return out


def size(path: Path) -> tuple[int, int]:
    """(width, height) from the IHDR chunk."""
    data = path.read_bytes()[:24]
    if data[:8] != SIGNATURE or data[12:16] != b"IHDR":
        raise ValueError(f"{path}: not a PNG file")
    w, h = struct.unpack(">II", data[16:24])
    return w, h


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def _unfilter(kind: int, line: bytearray, prev: bytes, bpp: int) -> bytes:
    n = len(line)
    if kind == 0:
        return bytes(line)
    if kind == 2:  # up
        return bytes((x + y) & 0xFF for x, y in zip(line, prev, strict=True))
    if kind == 1:  # sub
        for i in range(bpp, n):
            line[i] = (line[i] + line[i - bpp]) & 0xFF
        return bytes(line)
    if kind == 3:  # average
        for i in range(n):
            left = line[i - bpp] if i >= bpp else 0
            line[i] = (line[i] + ((left + prev[i]) >> 1)) & 0xFF
        return bytes(line)
    if kind == 4:  # paeth
        for i in range(n):
            a = line[i - bpp] if i >= bpp else 0
            c = prev[i - bpp] if i >= bpp else 0
            line[i] = (line[i] + _paeth(a, prev[i], c)) & 0xFF
        return bytes(line)
    raise ValueError(f"unknown PNG filter type {kind}")


def read(path: Path) -> Image:
    data = path.read_bytes()
    if data[:8] != SIGNATURE:
        raise ValueError(f"{path}: not a PNG file")
    pos, idat = 8, []
    width = height = channels = 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
            if depth != 8 or color not in (2, 6) or interlace:
                raise ValueError(f"{path}: only 8-bit RGB/RGBA, non-interlaced PNGs are read")
            channels = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
    raw = zlib.decompress(b"".join(idat))
    stride = width * channels
    rows, prev = [], bytes(stride)
    for y in range(height):
        start = y * (stride + 1)
        line = bytearray(raw[start + 1 : start + 1 + stride])
        prev = _unfilter(raw[start], line, prev, channels)
        rows.append(prev)
    return Image(width, height, channels, rows)


def write_crop(img: Image, path: Path, top: int, bottom: int) -> Path:
    """Rows [top, bottom) of an image as a new PNG (unfiltered), for looking at a part of it."""
    color = 2 if img.channels == 3 else 6
    ihdr = struct.pack(">IIBBBBB", img.width, bottom - top, 8, color, 0, 0, 0)
    raw = b"".join(b"\x00" + r for r in img.rows[top:bottom])

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body) & 0xFFFFFFFF
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    path.write_bytes(
        SIGNATURE + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
    )
    return path
