"""``preview``: one PNG per site, also for volumes, full-mask sites and empty splits; a legend
per class, the middle-slice index of volumes, and a box site's real boxes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from matplotlib import pyplot as plt
from matplotlib.image import imread
from matplotlib.patches import Polygon

from fedseg.data import FederationWriter
from fedseg.data.federation import FederatedDataset
from fedseg.data.preview import _palette, preview, site_figure
from fedseg.errors import DataError


def test_preview_of_volumes_and_empty_split(tmp_path: Path) -> None:
    w = FederationWriter(
        tmp_path / "fed",
        task="t",
        class_names=["bg", "organ"],
        modality="MRI",
        channels=1,
        spatial_shape=(6, 16, 16),
    )
    mask = np.zeros((6, 16, 16), np.uint8)
    mask[2:4, 4:12, 4:12] = 1
    for i in range(2):
        w.add("A", "train", f"v{i}", mask[None].astype(np.float32), mask)
    w.add("B", "test", "v0", mask[None].astype(np.float32), mask)
    w.finish({"A": "full", "B": "full"})
    paths = preview(tmp_path / "fed", tmp_path / "png", n=4)
    assert [p.name for p in paths] == ["A.png", "B.png"]
    # 2 samples x (image | mask), 220 px each, plus 35 px for the legend
    assert imread(paths[0]).shape[:2] == (475, 440)
    assert imread(paths[1]).shape[:2] == (255, 440)  # B has no train samples: one empty row

    fig = site_figure(FederatedDataset.open(tmp_path / "fed"), "A", "train", 4)
    titles = [ax.get_title() for ax in fig.axes]
    assert titles[:2] == ["v0 image (z=3 of 6)", "full mask"]
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == ["bg", "organ", "unlabeled (image only)"]
    plt.close(fig)


def test_box_site_shows_its_boxes_and_what_they_became(fundus_root: Path) -> None:
    fed = FederatedDataset.open(fundus_root)
    m = fed.manifest
    box_site = next(s.name for s in m.sites if s.annotation == "box")
    fig = site_figure(fed, box_site, "train", 1)
    image_ax, mask_ax, box_ax, label_ax = fig.axes
    assert box_ax.get_title() == "boxes (annotation)"
    assert label_ax.get_title() == f"{m.box_conversion} from boxes"
    mask = fed.load(box_site, "train").masks[0].numpy()
    colours = _palette(m.num_classes)
    patches = [p for p in box_ax.patches if isinstance(p, Polygon)]
    assert patches and not image_ax.patches and not mask_ax.patches
    for c in (int(v) for v in np.unique(mask) if v):  # one box per class, around its pixels
        ys, xs = np.nonzero(mask == c)
        (poly,) = [p for p in patches if np.allclose(p.get_edgecolor()[:3], colours[c])]
        corners = poly.get_xy()
        assert corners[:, 0].min() == pytest.approx(xs.min() - 0.5)
        assert corners[:, 0].max() == pytest.approx(xs.max() + 0.5)
        assert corners[:, 1].min() == pytest.approx(ys.min() - 0.5)
        assert corners[:, 1].max() == pytest.approx(ys.max() + 0.5)
    plt.close(fig)

    scribble_site = next(s.name for s in m.sites if s.annotation == "scribble")
    fig = site_figure(fed, scribble_site, "train", 1)
    assert [ax.get_title() for ax in fig.axes][1:] == ["full mask", "scribble (annotation)"]
    assert not any(ax.patches for ax in fig.axes)
    plt.close(fig)


def test_preview_default_folder_and_bad_split(fundus_root: Path, tmp_path: Path) -> None:
    paths = preview(fundus_root, tmp_path / "p", n=1, split="test")
    assert len(paths) == 5
    with pytest.raises(DataError, match=r"split must be one of"):
        preview(fundus_root, tmp_path / "p", split="holdout")
