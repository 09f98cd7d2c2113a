"""A small line-plot renderer that writes PNG with zlib and struct only.

matplotlib would add tens of MB to every image for two curves; a run report needs panels
with a frame, a few grid lines, a curve, and short labels (a built-in 3x5 pixel font).
"""

from __future__ import annotations

import math
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

Color = tuple[int, int, int]
WHITE: Color = (255, 255, 255)
BLACK: Color = (0, 0, 0)
GRID: Color = (225, 225, 225)
BLUE: Color = (31, 119, 180)
ORANGE: Color = (230, 110, 20)

# 3x5 glyphs, rows top to bottom, 3 bits each (4 = left column).
_FONT = {
    "0": (7, 5, 5, 5, 7), "1": (2, 6, 2, 2, 7), "2": (7, 1, 7, 4, 7), "3": (7, 1, 7, 1, 7),
    "4": (5, 5, 7, 1, 1), "5": (7, 4, 7, 1, 7), "6": (7, 4, 7, 5, 7), "7": (7, 1, 1, 2, 2),
    "8": (7, 5, 7, 5, 7), "9": (7, 5, 7, 1, 7), ".": (0, 0, 0, 0, 2), "-": (0, 0, 7, 0, 0),
    "+": (0, 2, 7, 2, 0), " ": (0, 0, 0, 0, 0), ":": (0, 2, 0, 2, 0), "/": (1, 1, 2, 4, 4),
    "a": (0, 7, 1, 7, 7), "c": (0, 7, 4, 4, 7), "e": (7, 5, 7, 4, 7), "g": (7, 5, 7, 1, 7),
    "i": (2, 0, 2, 2, 2), "l": (4, 4, 4, 4, 7), "n": (0, 6, 5, 5, 5), "o": (0, 7, 5, 5, 7),
    "p": (7, 5, 7, 4, 4), "r": (0, 7, 4, 4, 4), "s": (0, 7, 6, 1, 7), "t": (4, 7, 4, 4, 3),
    "u": (0, 5, 5, 5, 7), "x": (0, 5, 2, 2, 5),
}


class Canvas:
    def __init__(self, width: int, height: int, background: Color = WHITE) -> None:
        self.width, self.height = width, height
        self.pixels = bytearray(bytes(background) * (width * height))

    def set(self, x: int, y: int, color: Color) -> None:
        if 0 <= x < self.width and 0 <= y < self.height:
            i = 3 * (y * self.width + x)
            self.pixels[i:i + 3] = bytes(color)

    def get(self, x: int, y: int) -> Color:
        i = 3 * (y * self.width + x)
        return tuple(self.pixels[i:i + 3])  # type: ignore[return-value]

    def line(self, x0: int, y0: int, x1: int, y1: int, color: Color, width: int = 1) -> None:
        steps = max(abs(x1 - x0), abs(y1 - y0), 1)
        for i in range(steps + 1):
            x = round(x0 + (x1 - x0) * i / steps)
            y = round(y0 + (y1 - y0) * i / steps)
            for dx in range(width):
                for dy in range(width):
                    self.set(x + dx - width // 2, y + dy - width // 2, color)

    def rect(self, x0: int, y0: int, x1: int, y1: int, color: Color) -> None:
        self.line(x0, y0, x1, y0, color)
        self.line(x0, y1, x1, y1, color)
        self.line(x0, y0, x0, y1, color)
        self.line(x1, y0, x1, y1, color)

    def text(self, x: int, y: int, text: str, color: Color = BLACK, scale: int = 2) -> None:
        for ch in text.lower():
            rows = _FONT.get(ch, _FONT[" "])
            for r, bits in enumerate(rows):
                for c in range(3):
                    if bits & (4 >> c):
                        for sx in range(scale):
                            for sy in range(scale):
                                self.set(x + c * scale + sx, y + r * scale + sy, color)
            x += 4 * scale

    def png(self) -> bytes:
        raw = b"".join(b"\x00" + bytes(self.pixels[3 * y * self.width:3 * (y + 1) * self.width])
                       for y in range(self.height))

        def chunk(kind: bytes, data: bytes) -> bytes:
            return (struct.pack(">I", len(data)) + kind + data
                    + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))

        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)
        return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
                + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


@dataclass
class Series:
    title: str
    xs: Sequence[float]
    ys: Sequence[float]
    color: Color = BLUE


def _label(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1e4 or abs(value) < 1e-2:
        return f"{value:.1e}".replace("e-0", "e-").replace("e+0", "e+")
    return f"{value:.3g}"


def plot_panel(canvas: Canvas, box: tuple[int, int, int, int], series: Series) -> None:
    """One panel: frame, 3 horizontal grid lines with values, the curve, a title."""
    left, top, right, bottom = box
    points = [(float(x), float(y)) for x, y in zip(series.xs, series.ys)
              if math.isfinite(float(y))]
    canvas.text(left, top - 16, series.title)
    canvas.rect(left, top, right, bottom, BLACK)
    if not points:
        return
    x_lo, x_hi = min(p[0] for p in points), max(p[0] for p in points)
    y_lo, y_hi = min(p[1] for p in points), max(p[1] for p in points)
    if y_hi == y_lo:
        y_lo, y_hi = y_lo - (abs(y_lo) or 1) * 0.05, y_hi + (abs(y_hi) or 1) * 0.05
    if x_hi == x_lo:
        x_hi = x_lo + 1
    pad = 4

    def to_px(x: float, y: float) -> tuple[int, int]:
        px = left + pad + (x - x_lo) / (x_hi - x_lo) * (right - left - 2 * pad)
        py = bottom - pad - (y - y_lo) / (y_hi - y_lo) * (bottom - top - 2 * pad)
        return round(px), round(py)

    for i in range(3):
        value = y_lo + (y_hi - y_lo) * i / 2
        _, py = to_px(x_lo, value)
        canvas.line(left + 1, py, right - 1, py, GRID)
        canvas.text(right + 6, py - 5, _label(value))
    canvas.text(left, bottom + 8, _label(x_lo))
    last = _label(x_hi)
    canvas.text(right - 8 * len(last), bottom + 8, last)
    pixels = [to_px(x, y) for x, y in points]
    if len(pixels) == 1:
        canvas.line(*pixels[0], *pixels[0], series.color, width=5)
    for (x0, y0), (x1, y1) in zip(pixels, pixels[1:]):
        canvas.line(x0, y0, x1, y1, series.color, width=2)


def line_plots(path: Path, panels: Sequence[Series], width: int = 640,
               panel_height: int = 200) -> None:
    """Write the panels stacked, one above the other, to ``path`` as PNG."""
    margin_top, gap, right_margin = 28, 48, 96
    height = margin_top + len(panels) * (panel_height + gap)
    canvas = Canvas(width, height)
    for i, series in enumerate(panels):
        top = margin_top + i * (panel_height + gap)
        plot_panel(canvas, (16, top, width - right_margin, top + panel_height), series)
    Path(path).write_bytes(canvas.png())
