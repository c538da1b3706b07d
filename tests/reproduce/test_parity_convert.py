"""The parity drivers' conversion (benchmarks/parity): a fedseg federation written in the
layouts of llmir/FedLPPA, zxy1234321/FedBCS and jcwang123/PFL-Seg-Trans, and recorded per-case
predictions turned back into a fedseg run folder that the reports pair with fedseg's runs case
by case. No authors' code is run."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import cv2
import h5py
import numpy as np
import pytest
import yaml

from fedseg.data import FederatedDataset
from fedseg.reporting.runs import load_run
from fedseg.reporting.stats import case_values

PARITY = Path(__file__).resolve().parents[2] / "benchmarks" / "parity"


def _load_driver(name: str):
    """Import ``benchmarks/parity/<name>.py`` as a script runs it (its folder on the path)."""
    sys.path.insert(0, str(PARITY))
    try:
        spec = importlib.util.spec_from_file_location(f"parity_{name}", PARITY / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(PARITY))


fedlppa = _load_driver("fedlppa")
fedbcs = _load_driver("fedbcs")
pflseg = _load_driver("pflseg")
common = sys.modules["common"]  # the shared module the driver imported


@pytest.fixture(scope="module")
def fed_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fed") / "faz"
    return common.synth_federation(root, "faz", sites=2, size=32, train=3, test=2, seed=0)


def test_layout_holds_every_case_with_its_weak_key(fed_root: Path, tmp_path: Path) -> None:
    fed = FederatedDataset.open(fed_root)
    sups = fedlppa.write_layout(fed_root, tmp_path / "h5", "weak")
    case_map = common.read_case_map(tmp_path / "h5")
    assert len(sups) == 2 and "mask" not in sups
    for k, site in enumerate(fed.manifest.sites):
        for part in ("train", "test"):
            split = fed.load(site.name, part, "full")
            files = sorted((tmp_path / "h5" / f"Domain{k + 1}" / part).glob("*.h5"))
            assert [f.stem for f in files] == sorted(split.ids)
            for i, cid in enumerate(split.ids):
                name = f"Domain{k + 1}/{part}/{cid}.h5"
                assert case_map[name] == (site.name, cid)
                with h5py.File(tmp_path / "h5" / name) as h5:
                    np.testing.assert_array_equal(h5["mask"][:], split.masks[i].numpy())
                    np.testing.assert_allclose(h5["image"][:], split.images[i, 0].numpy())
                    assert (sups[k] in h5) == (part == "train")
                    if part == "train":  # unlabeled pixels: their value num_classes (2)
                        assert set(np.unique(h5[sups[k]][:])) <= {0, 1, 2}
    assert fedlppa.write_layout(fed_root, tmp_path / "full", "full") == ["mask", "mask"]


def _capture(path: Path, names: list[str], preds: np.ndarray, dice: float) -> None:
    np.savez_compressed(path, names=np.array(names), preds=preds, val_mean_dice=np.float64(dice))


def test_captures_become_fedseg_run_folders_paired_per_case(fed_root: Path, tmp_path: Path) -> None:
    fed = FederatedDataset.open(fed_root)
    fedlppa.write_layout(fed_root, tmp_path / "h5", "weak")
    cap = tmp_path / "capture"
    cap.mkdir()
    truth = {}
    for k, site in enumerate(fed.manifest.sites):
        test = fed.load(site.name, "test", "full")
        names = [f"Domain{k + 1}/test/{cid}.h5" for cid in reversed(test.ids)]  # their order
        masks = test.masks.numpy()[::-1].astype(np.uint8)
        truth[site.name] = dict(zip(reversed(test.ids), masks, strict=True))
        # round 1 perfect (their best), round 2 (the last) all background
        _capture(cap / f"client{k}_iter000005.npz", names, masks, 0.9)
        _capture(cap / f"client{k}_iter000010.npz", names, np.zeros_like(masks), 0.0)
    last, best, chosen = fedlppa.read_captures(cap, tmp_path / "h5", 2, 10)
    assert chosen == {s.name: 5 for s in fed.manifest.sites}
    cfg = common.arm_config(
        "parity-x", {"name": "fedavg"}, fed_root, labels="weak", seed=0, train={}
    )
    run = tmp_path / "run"
    res = common.write_run(run, fed_root, last, cfg, {"repository": "r", "selection": "last"})
    best_res = common.write_run(run / common.BEST, fed_root, best, cfg, {"repository": "r"})
    assert best_res["average"]["dsc"]["faz"] == 1.0
    assert res["average"]["dsc"]["faz"] == 0.0
    # fedseg's case order and ids; the reports read both folders and key cases by (site, id)
    loaded = load_run(run)
    assert loaded.config["parity"]["selection"] == "last"
    keys = {(s.name, cid) for s in fed.manifest.sites for cid in fed.ids(s.name, "test")}
    assert set(case_values(run / "cases.csv", "dsc")) == keys
    assert set(case_values(run / common.BEST / "cases.csv", "dsc").values()) == {100.0}
    assert json.loads((run / "results.json").read_text())["cases"] == {
        s.name: 2 for s in fed.manifest.sites
    }
    missing = {k: dict(list(v.items())[:1]) for k, v in truth.items()}
    with pytest.raises(Exception, match="no prediction for test cases"):
        common.write_run(tmp_path / "bad", fed_root, missing, cfg, {"repository": "r"})


def test_arm_config_like_a_fedseg_run_refuses_another_budget(
    fed_root: Path, tmp_path: Path
) -> None:
    like = tmp_path / "fedseg.yaml"
    train = {"rounds": 3, "batch_size": 4, "lr": 0.01}
    data = {"root": "elsewhere", "labels": "weak"}
    base = {"name": "x", "seed": 5, "data": data, "method": {"name": "fedavg"}, "train": train}
    like.write_text(yaml.safe_dump(base))
    cfg = common.arm_config(
        "p", {"name": "fedavg"}, fed_root, labels="weak", seed=1, train={"rounds": 3}, like=like
    )
    assert cfg["train"] == base["train"] and cfg["seed"] == 1 and cfg["name"] == "p"
    assert cfg["data"]["root"] == str(fed_root.resolve())
    with pytest.raises(SystemExit, match="rounds"):
        common.arm_config(
            "p", {"name": "fedavg"}, fed_root, labels="weak", seed=1, train={"rounds": 2}, like=like
        )


def test_fedbcs_lists_and_captures(tmp_path: Path) -> None:
    root = common.synth_federation(
        tmp_path / "nuclei", "nuclei", sites=4, size=32, train=2, test=2, seed=0
    )
    fed = FederatedDataset.open(root)
    data = tmp_path / "data"
    fedbcs.write_layout(root, data)
    names, preds = [], []
    for domain, site in zip(fedbcs.DOMAINS, fed.manifest.sites, strict=True):
        test = fed.load(site.name, "test", "full")
        lines = (data / domain / "val.txt").read_text().splitlines()
        assert [ln.split()[0] for ln in lines] == [f"{domain}/val/{c}.png" for c in test.ids]
        for ln, img, mask in zip(lines, test.images, test.masks, strict=True):
            png, mpng = (cv2.imread(str(data / p), cv2.IMREAD_UNCHANGED) for p in ln.split())
            assert png.dtype == np.uint16 and png.shape == (32, 32, 3)
            np.testing.assert_array_equal(mpng, mask.numpy())
            x = img.numpy().transpose(1, 2, 0)  # the same image up to its range
            np.testing.assert_allclose(
                png / 65535.0, (x - x.min()) / (x.max() - x.min()), atol=1e-4
            )
        assert len((data / domain / "train.txt").read_text().splitlines()) == 2
        names += [ln.split()[0] for ln in lines]
        preds += [m.numpy().astype(np.uint8) for m in test.masks]
    cap = tmp_path / "capture"
    cap.mkdir()
    truth = np.stack(preds)
    for r, (p, dice) in enumerate([(np.zeros_like(truth), 0.1), (truth, 0.8), (truth, 0.8)]):
        np.savez_compressed(cap / f"round{r:04d}.npz", names=np.array(names), preds=p,
                            class1_dice=np.full(4, dice))  # fmt: skip
    last, best, chosen = fedbcs.read_captures(cap, data, 3)
    assert chosen == 1  # the first of equal scores
    cfg = common.arm_config("p", {"name": "fedbcs"}, root, labels="full", seed=0, train={})
    res = common.write_selections(
        tmp_path / "run", root, last, best, cfg, {"repository": "r"}, rule="best", measured={}
    )
    assert res["average"]["dsc"] == {"nuclei": 1.0}
    assert load_run(tmp_path / "run" / common.BEST).config["parity"]["selection"] == "best"
    with pytest.raises(SystemExit, match="expected 0 to 3"):
        fedbcs.read_captures(cap, data, 4)


def _pflseg_layout(tmp_path: Path) -> tuple[Path, FederatedDataset, Path]:
    """A 4-site polyp federation and its PFL-Seg-Trans layout."""
    root = common.synth_federation(
        tmp_path / "polyp", "polyp", sites=4, size=32, train=1, test=2, seed=0
    )
    data = tmp_path / "data"
    pflseg.write_layout(root, data)
    return root, FederatedDataset.open(root), data


def test_pflseg_arrays_and_captures(tmp_path: Path) -> None:
    root, fed, data = _pflseg_layout(tmp_path)
    cap = tmp_path / "capture"
    cap.mkdir()
    for k, site in enumerate(fed.manifest.sites):
        test = fed.load(site.name, "test", "full")
        names = [f"polyp/Site{k + 1}/test/image/{c}.npy" for c in test.ids]
        for name, img, mask in zip(names, test.images, test.masks, strict=True):
            x = np.load(data / name)  # its loader: transpose to C x H x W, divide by 255
            np.testing.assert_allclose(x.transpose(2, 0, 1) / 255.0, img.numpy(), atol=1e-6)
            np.testing.assert_array_equal(
                np.load(data / name.replace("/image/", "/mask/")), mask.numpy() > 0
            )
        train = list((data / f"polyp/Site{k + 1}/train/image").glob("*.npy"))
        assert sorted(f.stem for f in train) == sorted(fed.ids(site.name, "train"))
        masks = test.masks.numpy().astype(np.uint8)
        # round 1 its best by test Jaccard, round 2 (the last) all background
        for r, (p, jac) in enumerate([(masks, 0.7), (np.zeros_like(masks), 0.2)]):
            np.savez_compressed(cap / f"site{k}_round{r:04d}.npz", names=np.array(names), preds=p,
                                jaccard=np.float64(jac))  # fmt: skip
    last, best, chosen = pflseg.read_captures(cap, data, 2)
    assert chosen == 0
    cfg = common.arm_config("p", {"name": "feddp"}, root, labels="full", seed=0, train={})
    res = common.write_selections(
        tmp_path / "run", root, last, best, cfg, {"repository": "r"}, rule="best", measured={}
    )
    assert res["average"]["dsc"] == {"polyp": 0.0}
    best_res = json.loads((tmp_path / "run" / common.BEST / "results.json").read_text())
    assert best_res["average"]["dsc"] == {"polyp": 1.0}


def test_pflseg_fine_tuning_picks_per_site_and_starts_from_the_last_round(tmp_path: Path) -> None:
    root, fed, data = _pflseg_layout(tmp_path)
    cap = tmp_path / "capture_ft"
    cap.mkdir()
    # evaluation 0 is the starting model; site k's Jaccard peaks at evaluation k (ties keep
    # the first), so sites 0-2 pick 0, 1, 2 and site 3, flat, keeps the start
    jaccards = {0: [0.5, 0.4, 0.4], 1: [0.3, 0.6, 0.6], 2: [0.1, 0.2, 0.3], 3: [0.5, 0.5, 0.5]}
    for k, site in enumerate(fed.manifest.sites):
        test = fed.load(site.name, "test", "full")
        names = [f"polyp/Site{k + 1}/test/image/{c}.npy" for c in test.ids]
        masks = test.masks.numpy().astype(np.uint8)
        for e, jac in enumerate(jaccards[k]):
            p = masks if e == 2 else np.zeros_like(masks)  # the last epoch right everywhere
            np.savez_compressed(cap / f"site{k}_round{e:04d}.npz", names=np.array(names), preds=p,
                                jaccard=np.float64(jac))  # fmt: skip
    last, picked, epochs = pflseg.read_ft_captures(cap, data, 2)
    assert epochs == [0, 1, 2, 0]
    cfg = common.arm_config("p", {"name": "feddp"}, root, labels="full", seed=0, train={})
    res = common.write_selections(
        tmp_path / "run", root, last, picked, cfg, {"repository": "r"}, rule="r", measured={}
    )
    assert res["average"]["dsc"] == {"polyp": 1.0}
    picked_res = json.loads((tmp_path / "run" / common.BEST / "results.json").read_text())
    names = [site.name for site in fed.manifest.sites]
    assert picked_res["sites"][names[2]]["dsc"]["polyp"] == 1.0
    assert picked_res["sites"][names[0]]["dsc"]["polyp"] < 1.0
    with pytest.raises(SystemExit, match="evaluated 4 times"):
        pflseg.read_ft_captures(cap, data, 3)
    # the fine-tuning step loads the last round's weights under its Site{k}_best.pth name
    code, last_cap = tmp_path / "code", tmp_path / "capture"
    model = code / "logs" / "polyp" / "ours_q_0_pvtb0_fpn_s0" / "model"
    model.mkdir(parents=True)
    last_cap.mkdir()
    for k in range(4):
        (model / f"Site{k + 1}_best.pth").write_bytes(b"its best round")
        (last_cap / f"site{k}_last.pth").write_bytes(b"the last round")
    assert pflseg.start_fine_tuning(code, last_cap, "ours_q", 0) == "ours_q_0_pvtb0_fpn_s0"
    assert (model / "Site4_best.pth").read_bytes() == b"the last round"
    assert (model / "Site4_its_best.pth").read_bytes() == b"its best round"
