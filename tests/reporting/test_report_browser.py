"""report.html opened in a headless browser (Debian's ``chromium``): its screenshot shows the
result tables and the learning-curve figures where the page lays them out.

Skipped only when ``chromium`` is not installed (scripts/test.sh installs it)."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

from fedseg.reporting.html import write_report

CHROMIUM = shutil.which("chromium")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (scripts/test.sh installs it via apt)"
)
WIDTH = 1280

# Appended to a copy of the page: after load, record where the tables and images are.
PROBE = """<script>
window.addEventListener("load", () => {
  const box = e => { const b = e.getBoundingClientRect();
    return [b.left, b.top + window.scrollY, b.width, b.height]; };
  document.body.setAttribute("data-layout", JSON.stringify({
    height: document.documentElement.scrollHeight,
    tables: [...document.querySelectorAll("table.results")].map(box),
    images: [...document.querySelectorAll("img")].map(
      e => ({alt: e.alt, box: box(e), loaded: e.complete && e.naturalWidth > 0})),
  }));
});
</script></body>"""


def _chromium(*args: str) -> str:
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    cmd += ["--force-device-scale-factor=1", "--virtual-time-budget=5000", *args]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout


def _crop(shot: np.ndarray, box: list[float]) -> np.ndarray:
    x, y, w, h = (round(v) for v in box)
    return shot[y : y + h, x : x + w]


def test_screenshot_shows_tables_and_curves(runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "rep"
    write_report([runs[k] for k in ("seed0", "seed1", "longer")], out)
    page = (out / "report.html").read_text()
    probe = out / "probe.html"
    probe.write_text(page.replace("</body>", PROBE))

    dom = _chromium(f"--window-size={WIDTH},1000", "--dump-dom", probe.as_uri())
    layout = json.loads(html.unescape(re.search(r'data-layout="([^"]*)"', dom).group(1)))
    height = int(layout["height"])
    shot_path = tmp_path / "shot.png"
    _chromium(f"--window-size={WIDTH},{height}", f"--screenshot={shot_path}", probe.as_uri())
    shot = imread(shot_path)[..., :3]
    assert shot.shape[:2] == (height, WIDTH)

    assert len(layout["tables"]) == 2  # DSC and HD95
    for box in layout["tables"]:
        grey = _crop(shot, box).mean(axis=-1)
        body = grey[len(grey) // 2 :]  # below the caption and header: the rows' cells
        assert (body < 0.4).mean() > 0.02, "no numbers drawn in the table's rows"
        assert (np.abs(grey - 232 / 255) < 0.02).mean() > 0.05, "no header row drawn"
        right = shot[int(box[1]) : int(box[1] + box[3]), int(box[0] + box[2]) + 10 :]
        assert right.size and (right > 0.98).all(), "page background beside the table"

    curves = [i for i in layout["images"] if "curves" in i["alt"]]
    assert len(curves) == 4  # the rows' learning curves and one per run
    for image in curves:
        assert image["loaded"] and image["box"][2] > 300 and image["box"][3] > 150
        pixels = _crop(shot, image["box"])
        coloured = (pixels.max(axis=-1) - pixels.min(axis=-1)) > 0.3  # the lines
        assert coloured.sum() > 300, image["alt"]
        assert (pixels.mean(axis=-1) < 0.3).sum() > 500, "axes and labels"
