"""The report's qualitative figure: fixed test cases per site, the same for every run, with
the ground truth and each row's prediction drawn from the runs' own models."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch
import yaml
from matplotlib.image import imread

from fedseg.export import load_exported
from fedseg.reporting.html import SEGMENTATIONS, write_report
from fedseg.reporting.segmentations import Case, _slice, pick_cases


def _figure(runs: list[Path], out: Path) -> tuple[list[str], np.ndarray, str]:
    """The case names the report's figure shows, the figure, and the HTML page."""
    write_report(runs, out)
    md = (out / "report.md").read_text()
    caption, path = re.search(rf"!\[{SEGMENTATIONS} ([^\]]+)\]\(([^)]+)\)", md).groups()
    page = (out / "report.html").read_text()
    return caption.split(", "), imread(out / path), page


def test_the_same_fixed_cases_for_every_run(runs: dict[str, Path], tmp_path: Path) -> None:
    one, small, page = _figure([runs["mu_small"]], tmp_path / "one")
    three, wide, _ = _figure([runs["seed0"], runs["mu_small"], runs["longer"]], tmp_path / "3")
    assert one == three  # the cases come from the data, not from the runs shown
    assert [c.split("/")[0] for c in one] == ["A", "A", "B", "B"]  # two per site
    assert f'alt="{SEGMENTATIONS} {", ".join(one)}"' in page  # inline in report.html
    assert wide.shape[1] > small.shape[1] * 1.4  # one column more per row: 3 + 2 vs 1 + 2
    assert wide.shape[0] == small.shape[0]  # one line per case, whatever the runs
    cases = pick_cases(_root(runs["seed0"]), ["A", "B"], "test", 2)
    assert [c.name for c in cases] == one and all(c.mask.any() for c in cases)


def _root(run: Path) -> Path:
    return Path(yaml.safe_load((run / "config.yaml").read_text())["data"]["root"])


def test_cases_have_foreground_and_predictions_come_from_the_run(runs: dict[str, Path]) -> None:
    root = _root(runs["longer"])
    files = sorted((root / "sites/A/train").glob("*.npz"))
    with_foreground = [p.stem for p in files if np.load(p)["mask"].any()]
    assert 3 <= len(with_foreground) < len(files) + 1
    cases = pick_cases(root, ["A"], "train", 3)
    ends = [with_foreground[0], with_foreground[-1]]  # evenly spread: first and last included
    assert len(cases) == 3 and [cases[0].id, cases[-1].id] == ends
    assert cases[1].id in with_foreground[1:-1]
    model = load_exported(runs["longer"] / "models" / "A.pt")
    maps = model.label_maps(torch.from_numpy(np.stack([c.image for c in cases])))
    assert maps.shape == (3, 32, 32) and maps.unique().numel() > 1  # something to draw


def test_a_volume_shows_the_slice_with_most_foreground() -> None:
    mask = np.zeros((5, 8, 8), np.uint8)
    mask[1, 2:4, 2:4] = 1
    mask[3, 1:7, 1:7] = 2
    image = np.random.default_rng(0).random((1, 5, 8, 8)).astype(np.float32)
    shown, truth, z = _slice(Case("A", "v0", image, mask))
    assert z == 3 and np.array_equal(truth, mask[3]) and np.array_equal(shown, image[0, 3])
