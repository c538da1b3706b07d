"""``brain``: template-derived slices with grey/white-matter labels and per-site artefacts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedseg.data import FederatedDataset
from fedseg.data.synth import synthesize


@pytest.fixture(scope="module")
def brain_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    mp = pytest.MonkeyPatch()
    mp.setenv("NILEARN_DATA", str(tmp_path_factory.mktemp("nilearn_data")))  # stays offline
    root = tmp_path_factory.mktemp("brain") / "fed"
    synthesize("brain", root, size=32, per_site=8, seed=0)
    mp.undo()
    return root


def test_brain_federation_is_honestly_described(brain_root: Path) -> None:
    m = FederatedDataset.open(brain_root).manifest
    assert m.class_names == ["background", "grey_matter", "white_matter"]
    assert m.regions == {"grey_matter": [1], "white_matter": [2]}
    assert "template-derived, simulated multi-site" in m.source
    assert "not multi-centre" in m.source
    assert len(m.sites) == 4 and all(s.annotation == "full" for s in m.sites)


def test_labels_are_plausible_tissue_maps(brain_root: Path) -> None:
    fed = FederatedDataset.open(brain_root)
    for site in fed.site_names:
        split = fed.load(site, "train")
        masks, images = split.masks.numpy(), split.images.numpy()[:, 0]
        gm, wm = (masks == 1).mean(), (masks == 2).mean()
        assert 0.05 < gm < 0.4 and 0.03 < wm < 0.4, (site, gm, wm)
        assert images.min() >= 0 and images.max() <= 1
        # labels sit on the anatomy: the head is brighter than the background
        assert images[masks > 0].mean() > images[masks == 0].mean() + 0.2


def test_sites_differ_by_scanner_artefacts(brain_root: Path) -> None:
    fed = FederatedDataset.open(brain_root)
    noise = {}
    for site in fed.site_names:
        images = fed.load(site, "train").images.numpy()[:, 0]
        corner = images[:, :4, :4]  # air: only noise, ghosts and ringing live here
        noise[site] = float(corner.std())
    assert max(noise.values()) > 3 * min(noise.values()), noise


def test_deterministic(brain_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NILEARN_DATA", str(tmp_path / "nilearn"))
    synthesize("brain", tmp_path / "again", size=32, per_site=8, seed=0)
    a = FederatedDataset.open(brain_root).load("B", "test")
    b = FederatedDataset.open(tmp_path / "again").load("B", "test")
    assert np.array_equal(a.images, b.images) and np.array_equal(a.masks, b.masks)
