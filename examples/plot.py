"""A line plot as a hand-written SVG (no plotting library needed)."""

from __future__ import annotations

import math
from pathlib import Path

WIDTH, HEIGHT, MARGIN = 640, 360, 48


def write_svg(
    path: Path, points: list[tuple[float, float]], title: str = "reward per step"
) -> None:
    """Plot ``points`` (step, reward), reward on a 0..1 axis, into an SVG file at ``path``."""
    points = [(x, y) for x, y in points if math.isfinite(y)]
    last = max((x for x, _ in points), default=1.0) or 1.0
    top = max(1.0, max((y for _, y in points), default=1.0))

    def at(x: float, y: float) -> str:
        px = MARGIN + (WIDTH - 2 * MARGIN) * (x / last)
        py = HEIGHT - MARGIN - (HEIGHT - 2 * MARGIN) * (y / top)
        return f"{px:.1f},{py:.1f}"

    grid = "".join(
        f'<line x1="{MARGIN}" x2="{WIDTH - MARGIN}" y1="{at(0, v).split(",")[1]}" '
        f'y2="{at(0, v).split(",")[1]}" stroke="#ddd"/>'
        f'<text x="{MARGIN - 6}" y="{at(0, v).split(",")[1]}" font-size="11" '
        f'text-anchor="end" dominant-baseline="middle">{v:.2f}</text>'
        for v in (0.0, 0.25, 0.5, 0.75, 1.0)
    )
    line = " ".join(at(x, y) for x, y in points)
    path.write_text(
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'font-family="sans-serif">'
        f'<rect width="100%" height="100%" fill="white"/>{grid}'
        f'<polyline fill="none" stroke="#1f77b4" stroke-width="2" points="{line}"/>'
        f'<text x="{WIDTH / 2}" y="24" font-size="14" text-anchor="middle">{title}</text>'
        f'<text x="{WIDTH / 2}" y="{HEIGHT - 12}" font-size="11" text-anchor="middle">'
        f"step (0..{last:.0f})</text></svg>\n"
    )
