"""The synthetic pancreas-like 3D federation and the volumetric fully supervised pipeline."""

from pathlib import Path

import numpy as np
import pytest
import torch

from fedseg.config import load_config
from fedseg.data import FederatedDataset
from fedseg.data.synth import SYNTH_TASKS, synthesize
from fedseg.data.synth.tasks.pancreas3d import STYLES, _anatomy, sample, spacing, spatial_shape
from fedseg.data.transforms import augment
from fedseg.engine.simulation import Simulation
from fedseg.engine.sites import load_sites
from fedseg.methods import TrainSettings, get_method

CONFIGS = sorted((Path(__file__).parents[1] / "configs" / "pancreas3d").glob("*.yaml"))


@pytest.fixture(scope="module")
def federation(tmp_path_factory) -> FederatedDataset:
    root = tmp_path_factory.mktemp("pancreas3d")
    synthesize("pancreas3d", root, size=16, per_site=8, split=(0.65, 0.15, 0.2))
    return FederatedDataset.open(root)


def test_seven_imbalanced_sites_with_val_splits_and_spacing(federation):
    m = federation.manifest
    assert (m.ndim, tuple(m.spatial_shape), m.channels) == (3, (16, 16, 16), 1)
    assert m.class_names == ["background", "pancreas"] and len(m.sites) == 7
    totals = {s.name: sum(s.splits.values()) for s in m.sites}
    tiny = sorted(totals, key=totals.get)[:2]
    assert tiny == ["D", "E"] and max(totals[t] for t in tiny) * 3 <= totals["C"]
    assert all(s.splits["val"] >= 1 and s.splits["test"] >= 1 for s in m.sites)
    steps = set()
    for i, name in enumerate(federation.site_names):
        test = federation.load(name, "test")
        assert test.spacing == [spacing(STYLES[i], 16)] * len(test)
        assert test.images.shape[1:] == (1, 16, 16, 16)
        steps.add(test.spacing[0])
    assert len(steps) == 7  # every centre has its own voxel size


def test_default_size_is_32x64x64_and_depth_never_below_16():
    assert spatial_shape(64) == (32, 64, 64)
    assert spatial_shape(16) == (16, 16, 16)
    assert {"pancreas3d", "pancreas3d_t1", "pancreas3d_t2"} <= set(SYNTH_TASKS.names())


def test_organ_is_small_and_variable():
    rng = np.random.default_rng(0)
    fractions = [sample(STYLES[0], 32, rng)[1].mean() for _ in range(8)]
    assert min(fractions) > 0 and max(fractions) < 0.03
    assert np.std(fractions) / np.mean(fractions) > 0.15


@pytest.mark.parametrize(("task", "fluid_brighter_than_fat"), [("t1", False), ("t2", True)])
def test_t1_and_t2_like_contrasts(task, fluid_brighter_than_fat):
    style = SYNTH_TASKS.get(f"pancreas3d_{task}").styles[2]
    tissues, pancreas = _anatomy(spatial_shape(32), np.random.default_rng(5))
    image, mask = sample(style, 32, np.random.default_rng(5))  # same anatomy
    assert np.array_equal(mask, pancreas)
    fluid = image[0][tissues["fluid.stomach"]].mean()
    fat = image[0][tissues["fat.inner"] & ~pancreas].mean()
    assert bool(fluid > fat) == fluid_brighter_than_fat


def test_augment_moves_3d_images_and_labels_together():
    gen = torch.Generator().manual_seed(0)
    labels = (torch.rand(4, 8, 16, 16, generator=gen) > 0.7).long()
    images = labels.unsqueeze(1).float()
    x, y = augment(images, labels, gen)
    assert x.shape == images.shape and y.shape == labels.shape
    assert torch.equal(x[:, 0] > 0.5, y == 1)
    assert not torch.equal(y, labels)  # something was flipped or rotated


def test_on_disk_federation_trains_fedavg_aaw_in_3d_with_physical_spacing(federation):
    spec, sites = load_sites(federation, "full", ["A", "D"])
    assert spec.ndim == 3 and sites["D"].val is not None
    cls = get_method("fedavg_aaw")
    train = TrainSettings(rounds=2, local_iters=1, batch_size=2, loss="dice_bce")
    sim = Simulation(cls(cls.Config(), spec), sites, train, seed=0)
    records = [sim.round(r) for r in range(2)]
    weights = records[1]["server"]["aaw_weights"]
    assert set(weights) == {"A", "D"} and sum(weights.values()) == pytest.approx(1.0)
    assert sites["D"].test_spacing == [spacing(STYLES[3], 16)] * len(sites["D"].test_ids)
    res = sim.evaluate(federation.manifest.regions, batch_size=2)
    for r in res.values():
        values = {m: v["pancreas"] for m, v in r["metrics"].items()}
        assert set(values) >= {"dsc", "jaccard", "precision", "recall", "hd95", "assd"}
        assert all(np.isfinite(v) and v >= 0 for v in values.values())


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_configs_are_valid(path):
    cfg = load_config(path)
    assert cfg.train.loss == "dice_bce" and cfg.data.synth.task == "pancreas3d"
    assert cfg.method_name in {"local", "fedavg", "fedavg_aaw", "fedprox_aaw"}
