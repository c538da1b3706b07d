"""Synthetic federations: contract of every task, determinism, heterogeneity, errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedseg.data import FederatedDataset, check_federation
from fedseg.data.synth import SYNTH_TASKS, SynthTask, synthesize
from fedseg.data.synth.base import letter_names, site_sizes, site_style, split_sizes
from fedseg.errors import DataError, RegistryError

PAPER_TABLE_I = {
    "fundus": ("scribble", "scribble2", "box", "point", "block"),
    "faz": ("scribble", "point", "block", "box", "scribble2"),
    "polyp": ("point", "scribble", "rotated_box", "block"),
    "prostate": ("block", "point", "scribble", "point", "scribble2", "box"),
}


@pytest.mark.parametrize("name", SYNTH_TASKS.names())
def test_every_registered_task_meets_the_contract(name: str) -> None:
    task = SYNTH_TASKS.get(name)
    images, masks = task.generate(0, 2, 32, np.random.default_rng(0))
    shape = task.spatial_shape(32)
    assert images.shape == (2, task.channels, *shape) and images.dtype == np.float32
    assert masks.shape == (2, *shape) and masks.dtype == np.uint8
    assert np.isfinite(images).all()
    assert set(np.unique(masks).tolist()) <= set(range(len(task.class_names)))
    assert (masks > 0).any()
    assert len(task.size_weights) >= 1 and len(task.annotations) >= 1 and task.source


@pytest.mark.parametrize(("name", "annotations"), PAPER_TABLE_I.items())
def test_default_sites_follow_the_paper(name: str, annotations: tuple[str, ...]) -> None:
    assert SYNTH_TASKS.get(name).annotations == annotations


def test_images_are_in_unit_range_and_every_class_appears() -> None:
    for name in PAPER_TABLE_I:
        task = SYNTH_TASKS.get(name)
        for site in range(len(task.annotations)):
            images, masks = task.generate(site, 4, 32, np.random.default_rng(site))
            assert images.min() >= 0 and images.max() <= 1, (name, site)
            assert set(np.unique(masks).tolist()) == set(range(len(task.class_names)))


@pytest.mark.parametrize("name", [*PAPER_TABLE_I, "nuclei"])
def test_sites_look_different_and_samples_vary(name: str) -> None:
    """Between-site spread of image statistics dwarfs the within-site spread, while object
    size and position vary from sample to sample."""
    task = SYNTH_TASKS.get(name)
    stats, areas, centres = [], [], []
    for site in range(len(task.annotations)):
        images, masks = task.generate(site, 12, 48, np.random.default_rng(site))
        fg = masks > 0
        # per image: mean and contrast of each channel, and foreground/background contrast
        per_image = [
            np.concatenate([im.mean((1, 2)), im.std((1, 2)), im[:, f].mean(1) - im[:, ~f].mean(1)])
            for im, f in zip(images, fg, strict=True)
        ]
        stats.append(np.asarray(per_image))
        areas += fg.sum((1, 2)).tolist()
        centres += [np.argwhere(f).mean(0) for f in fg]
    site_means = np.stack([s.mean(0) for s in stats])
    within = np.mean([s.var(0) for s in stats], axis=0)
    ratio = site_means.var(0) / np.maximum(within, 1e-9)
    assert ratio.max() > 3, ratio  # at least one appearance feature separates sites clearly
    assert np.std(areas) / np.mean(areas) > 0.2
    assert np.std(np.asarray(centres), axis=0).min() > 1.0


def test_synthesize_writes_an_imbalanced_federation(tmp_path: Path) -> None:
    m = synthesize("polyp", tmp_path / "f", size=32, per_site=20, seed=1)
    assert m.site_names == ["A", "B", "C", "D"]
    totals = [sum(s.splits.values()) for s in m.sites]
    assert len(set(totals)) > 2 and abs(np.mean(totals) - 20) <= 2
    for s in m.sites:
        n = sum(s.splits.values())
        assert s.splits == split_sizes(n, (0.7, 0.1, 0.2))
    assert m.weak_labels is None and "synthetic" in m.source and "not patient data" in m.source
    fed = FederatedDataset.open(tmp_path / "f")
    assert check_federation(fed) == []
    assert fed.load("C", "train").images.shape[1:] == (3, 32, 32)


def test_synthesize_is_deterministic_per_seed(tmp_path: Path) -> None:
    for run, seed in (("a", 3), ("b", 3), ("c", 4)):
        synthesize("faz", tmp_path / run, sites=2, size=32, per_site=6, seed=seed)
    a, b, c = (FederatedDataset.open(tmp_path / r).load("B", "train") for r in "abc")
    assert a.ids == b.ids
    assert np.array_equal(a.images, b.images) and np.array_equal(a.masks, b.masks)
    assert not np.array_equal(a.images, c.images)


def test_extra_sites_cycle_annotations_and_get_new_styles(tmp_path: Path) -> None:
    m = synthesize("polyp", tmp_path / "f", sites=6, size=32, per_site=8, seed=0)
    assert [s.annotation for s in m.sites][4:] == ["point", "scribble"]
    styles = SYNTH_TASKS.get("polyp").styles
    assert site_style(styles, 1) is styles[1]
    assert site_style(styles, 5) != styles[1] and site_style(styles, 5) == site_style(styles, 5)


def test_style_shift_moves_every_site_towards_the_mean_site(tmp_path: Path) -> None:
    """``style_shift`` 1 is the task's styles, 0 one mean site, 0.5 halfway; recorded in the
    manifest, and a run config that asks for another shift than the folder's is refused."""
    styles = SYNTH_TASKS.get("fundus").styles
    assert site_style(styles, 2, 1.0) is styles[2]
    mean_gain = float(np.mean([s.gain for s in styles]))
    same = {site_style(styles, i, 0.0) for i in range(len(styles))}
    assert len(same) == 1 and next(iter(same)).gain == pytest.approx(mean_gain)
    half = site_style(styles, 1, 0.5)
    assert half.gain == pytest.approx((styles[1].gain + mean_gain) / 2)
    assert half.tint[0] == pytest.approx(
        (styles[1].tint[0] + np.mean([s.tint[0] for s in styles])) / 2
    )
    assert isinstance(half.spots, int)
    with pytest.raises(DataError, match="style shift must be >= 0"):
        site_style(styles, 0, -0.1)
    flat = synthesize("fundus", tmp_path / "flat", sites=3, size=32, per_site=6, style_shift=0.0)
    designed = synthesize("fundus", tmp_path / "designed", sites=3, size=32, per_site=6)
    assert (flat.style_shift, designed.style_shift) == (0.0, 1.0)

    def spread(root: Path) -> float:
        """Range over sites of the mean image intensity per channel."""
        fed = FederatedDataset.open(root)
        means = [fed.load(n, "train").images.mean((0, 2, 3)) for n in fed.site_names]
        return float(np.ptp(np.stack(means), axis=0).max())

    assert spread(tmp_path / "flat") < spread(tmp_path / "designed") / 3


def test_paper_proportions_and_names(tmp_path: Path) -> None:
    """FedBCS's nuclei sites in its image-count proportions, named after the datasets."""
    m = synthesize(
        "nuclei", tmp_path / "n", size=32, per_site=20, site_weights=[97, 200, 462, 50],
        names="paper",
    )  # fmt: skip
    assert m.site_names == ["TCIA", "CRC", "KIRC", "TNBC"]
    totals = np.array([sum(s.splits.values()) for s in m.sites], float)
    assert np.allclose(totals / totals.sum(), np.array([97, 200, 462, 50]) / 809, atol=0.02)
    assert check_federation(FederatedDataset.open(tmp_path / "n")) == []
    m = synthesize("prostate", tmp_path / "p", size=32, per_site=5, names="paper")
    assert m.site_names == ["RUNMC", "BMC", "HCRUDB", "UCL", "BIDMC", "HK"]


def test_more_than_26_sites_get_two_letter_names(tmp_path: Path) -> None:
    assert letter_names(28)[24:] == ["Y", "Z", "AA", "AB"]
    assert letter_names(26 * 27 + 1)[-1] == "AAA"
    m = synthesize("faz", tmp_path / "f", sites=28, size=16, per_site=5)
    assert m.site_names[-2:] == ["AA", "AB"] and len(set(m.site_names)) == 28


def test_nuclei_tiles_hold_many_small_nuclei_in_stain_colours() -> None:
    task = SYNTH_TASKS.get("nuclei")
    images, masks = task.generate(0, 4, 64, np.random.default_rng(0))
    from scipy import ndimage

    counts = [ndimage.label(m)[1] for m in masks]
    assert min(counts) >= 10  # many objects per tile, not one blob
    assert max(ndimage.sum(m, ndimage.label(m)[0], range(1, c + 1)).max()
               for m, c in zip(masks, counts, strict=True)) < 0.05 * 64 * 64  # fmt: skip
    fg, bg = masks > 0, masks == 0
    nuclei_rgb = images.transpose(1, 0, 2, 3)[:, fg].mean(1)
    stroma_rgb = images.transpose(1, 0, 2, 3)[:, bg].mean(1)
    assert nuclei_rgb.sum() < stroma_rgb.sum()  # hematoxylin is darker than eosin
    assert nuclei_rgb[2] > nuclei_rgb[1] and stroma_rgb[0] > stroma_rgb[1]  # purple vs pink


def test_site_sizes_and_splits() -> None:
    assert site_sizes((1, 1, 2), 40) == [30, 30, 60]
    assert site_sizes((1, 20), 4) == [5, 8]  # never below the minimum of 5
    assert split_sizes(11, (0.7, 0.1, 0.2)) == {"train": 8, "val": 1, "test": 2}
    with pytest.raises(DataError, match=r"summing to 1"):
        split_sizes(10, (0.5, 0.1, 0.1))


def test_errors(tmp_path: Path) -> None:
    with pytest.raises(RegistryError, match=r"unknown synthetic task 'fundos'.*fundus"):
        synthesize("fundos", tmp_path / "x")
    with pytest.raises(DataError, match=r"--sites must be in 1..10000"):
        synthesize("fundus", tmp_path / "x", sites=0)
    with pytest.raises(DataError, match=r"--site-weights must be positive"):
        synthesize("fundus", tmp_path / "x", site_weights=[1, 0])
    with pytest.raises(DataError, match=r"--sites 3 disagrees with the 2 --site-weights"):
        synthesize("fundus", tmp_path / "x", sites=3, site_weights=[1, 2])
    with pytest.raises(DataError, match=r"--names paper: task 'prostate' names 6 sites"):
        synthesize("prostate", tmp_path / "x", sites=7, names="paper")
    synthesize("fundus", tmp_path / "f", sites=1, size=16, per_site=5)
    with pytest.raises(DataError, match=r"not empty.*--overwrite"):
        synthesize("fundus", tmp_path / "f", sites=1, size=16, per_site=5)
    m = synthesize("polyp", tmp_path / "f", sites=1, size=16, per_site=5, overwrite=True)
    assert m.task == "polyp" and check_federation(FederatedDataset.open(tmp_path / "f")) == []
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(DataError, match=r"refusing to clear"):
        synthesize("fundus", tmp_path / "other", overwrite=True)
    assert (tmp_path / "other" / "notes.txt").exists()


def _sample(style: float, size: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    mask = np.zeros((size, size), np.uint8)
    mask[size // 4 : size // 2, size // 4 : size // 2] = 1
    return (style * mask + rng.random((size, size)) * 0.1)[None].astype(np.float32), mask


def test_a_new_task_is_one_registration(tmp_path: Path) -> None:
    SYNTH_TASKS.register("test_squares")(
        SynthTask(
            class_names=("bg", "square"),
            modality="toy",
            channels=1,
            styles=(0.5, 0.9),
            sample=_sample,
            annotations=("block", "point"),
            size_weights=(1, 2),
            source="test squares",
            spacing=lambda style, size: (style, 64 / size),
        )
    )
    m = synthesize("test_squares", tmp_path / "f", size=16, per_site=6)
    assert [s.annotation for s in m.sites] == ["block", "point"]
    fed = FederatedDataset.open(tmp_path / "f")
    assert check_federation(fed) == []
    assert fed.load("B", "train").spacing[0] == (0.9, 4.0)
