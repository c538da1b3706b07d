"""Models out of a run: site models rebuilt from the checkpoint score what the run scored;
export (state dict, ONNX) and predict (PNG, NIfTI, sliding windows) on new files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import cv2
import nibabel as nib
import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from fedseg.cli import app
from fedseg.config import parse_config
from fedseg.engine.runner import InProcessRunner
from fedseg.errors import ConfigError, DataError, FedsegError
from fedseg.export import export_run, load_exported
from fedseg.inference import RunModels, predict_files, window_labels
from fedseg.metrics import MetricAccumulator
from fedseg.onnx_model import MAX_DISAGREEMENT, OnnxLabelMaps

cli = CliRunner()


def _train(
    root: Path, out: Path, method: str, synth: dict, amp: str = "off", iters: int = 6, **extra
) -> Path:
    cfg = parse_config(
        {
            "name": f"tiny-{method}",
            "data": {"root": str(root), "labels": "full", "synth": synth, **extra},
            "method": {"name": method},
            "train": {
                "rounds": 4,  # enough for every fixture model to segment something (any layout)
                "local_iters": iters,
                "batch_size": 4,
                "optimizer": "adamw",
                "lr": 0.01,
            },
            "eval": {"batch_size": 4},
            # float32 by default: bf16 kernels differ between CPUs (AMX or not), and what
            # most of these models must show (an exported model agrees with onnxruntime) is
            # not about bf16; one run forces bf16 (emulated where the CPU lacks it)
            "engine": {"amp": amp},
        }
    )
    InProcessRunner(cfg, out).run()
    return out


@pytest.fixture(scope="module")
def fundus_runs(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("fundus")
    synth = {"task": "fundus", "sites": 2, "size": 32, "per_site": 10}
    # FedBN's site models segment nothing after 4 x 6 steps on some CPUs (all-zero DSC on an
    # AMD EPYC, 2026-12-01): 10 steps a round make the comparison below non-vacuous there too
    iters = {"fedavg": 6, "fedbn": 10, "centralized": 6}
    runs = {m: _train(tmp / "data", tmp / m, m, synth, iters=n) for m, n in iters.items()}
    runs["fedavg-bf16"] = _train(tmp / "data", tmp / "fedavg-bf16", "fedavg", synth, amp="bf16")
    return runs


@pytest.fixture(scope="module")
def pancreas_run(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("pancreas")
    synth = {"task": "pancreas3d", "size": 16, "per_site": 6, "weak_labels": False}
    return _train(tmp / "data", tmp / "run", "fedavg", synth, sites=["A", "B"])


@pytest.mark.parametrize("method", ["fedavg", "fedbn", "centralized", "fedavg-bf16"])
def test_site_models_score_what_the_run_scored(fundus_runs, method):
    # a rebuilt model scores in the run's precision (fedavg-bf16: bf16), so exactly as the run
    run = fundus_runs[method]
    results = json.loads((run / "results.json").read_text())
    models = RunModels(run)
    scored = []
    for site in models.site_names:
        data = models.sites[site]
        pred = models.site_model(site).label_maps(data.test_images, batch_size=3)
        acc = MetricAccumulator(models.manifest.regions)
        acc.add(pred, data.test_masks)
        dsc = acc.aggregate()["dsc"]
        assert dsc == pytest.approx(results["sites"][site]["dsc"], abs=1e-12)
        scored += dsc.values()
    assert max(scored) > 0.05  # the models segment something: the comparison is not vacuous
    a, b = (models.site_model(s).model.state_dict() for s in models.site_names)
    bn = next(k for k in a if k.endswith("running_mean"))
    glob = models.global_model()
    if method != "fedbn":  # one model for every site (centralized: the pooled site's)
        assert glob is not None and models.model_names()[-1] == "global"
        assert all(torch.equal(a[k], b[k]) for k in a)
    else:  # private BN: each site evaluates with its own statistics, no global model
        assert glob is None and not torch.equal(a[bn], b[bn])


def test_missing_site_state_is_a_clear_error(fundus_runs, tmp_path):
    run = fundus_runs["fedbn"]
    copy = tmp_path / "copy"
    (copy / "checkpoints").mkdir(parents=True)
    (copy / "config.yaml").write_text((run / "config.yaml").read_text())
    ck = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    torch.save({**ck, "sites": {}}, copy / "checkpoints" / "last.pt")
    with pytest.raises(FedsegError, match=r"no private state of .*'A'"):
        RunModels(copy).site_model("A")
    with pytest.raises(FedsegError, match="no site of this run"):
        RunModels(run).site_model("Z")


def test_export_state_dict_and_onnx_reproduce_the_site_model(fundus_runs, tmp_path):
    import onnxruntime as ort

    run = fundus_runs["fedavg"]
    out = tmp_path / "export"
    res = cli.invoke(
        app, ["export", str(run), "--out", str(out), "--onnx", "--site", "A", "--site", "B"]
    )
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in out.iterdir()) == ["A.onnx", "A.pt", "B.onnx", "B.pt"]
    models = RunModels(run)
    labels: set[int] = set()
    for site in models.site_names:
        record = torch.load(out / f"{site}.pt", weights_only=True)
        info = record["info"]
        assert info["class_names"] == ["background", "cup", "rim"]
        assert info["regions"] == models.manifest.regions and "disc" in info["regions"]
        assert (info["channels"], info["spatial_shape"], info["site"]) == (3, [32, 32], site)
        assert record["config"]["method"]["name"] == "fedavg" and record["rebuildable"]
        images = models.sites[site].test_images
        want = models.site_model(site).label_maps(images)
        labels |= set(want.unique().tolist())
        assert torch.equal(load_exported(out / f"{site}.pt").label_maps(images), want)
        session = ort.InferenceSession(str(out / f"{site}.onnx"))
        for n in (1, len(images)):  # any batch size
            got = session.run(["labels"], {"images": images[:n].numpy()})[0]
            assert got.shape == tuple(want[:n].shape)
            assert (torch.from_numpy(got) == want[:n]).float().mean() >= 1 - MAX_DISAGREEMENT
    assert len(labels) > 1  # the maps hold more than background: the comparison is not vacuous
    # the .onnx file itself predicts (class names and training size from the .pt beside it)
    by_onnx = load_exported(out / "A.onnx")
    assert isinstance(by_onnx.model, OnnxLabelMaps) and by_onnx.info.site == "A"
    images = models.sites["A"].test_images
    agree = by_onnx.label_maps(images) == models.site_model("A").label_maps(images)
    assert agree.float().mean() >= 1 - MAX_DISAGREEMENT
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(out / "A.onnx", alone / "A.onnx")
    res = cli.invoke(
        app, ["predict", str(alone / "A.onnx"), "--input", str(alone), "--out", str(tmp_path)]
    )
    assert res.exit_code == 2 and "ONNX file alone" in res.output and "A.pt" in res.output


def test_export_of_global_model(fundus_runs, tmp_path):
    res = cli.invoke(
        app, ["export", str(fundus_runs["fedavg"]), "--out", str(tmp_path), "--site", "global"]
    )
    assert res.exit_code == 0, res.output
    models = RunModels(fundus_runs["fedavg"])
    images = models.sites["B"].test_images
    glob = load_exported(tmp_path / "global.pt")
    assert torch.equal(glob.label_maps(images), models.site_model("B").label_maps(images))


def test_export_of_a_model_that_is_more_than_its_weights(fundus_runs, tmp_path):
    synth = {"task": "fundus", "sites": 2, "size": 32, "per_site": 10}
    data = RunModels(fundus_runs["fedavg"]).cfg.data.root
    run = _train(data, tmp_path / "fedlc", "fedlc", synth)  # the site index lives on the net
    models = RunModels(run)
    export_run(models, tmp_path / "plain", ["A"])
    assert not torch.load(tmp_path / "plain" / "A.pt", weights_only=True)["rebuildable"]
    with pytest.raises(ConfigError, match=r"export it with --onnx \(A\.onnx\)"):
        load_exported(tmp_path / "plain" / "A.pt")
    export_run(models, tmp_path / "onnx", ["A"], onnx=True)
    images = models.sites["A"].test_images
    want = models.site_model("A").label_maps(images)
    got = load_exported(tmp_path / "onnx" / "A.pt").label_maps(images)  # run by onnxruntime
    assert (got == want).float().mean() >= 1 - MAX_DISAGREEMENT


def _write_png(path: Path, image: torch.Tensor) -> np.ndarray:
    """``image`` [3, H, W] in [0, 1] as an 8-bit RGB PNG; returns what it holds in [0, 1]."""
    rgb = np.rint(image.numpy().transpose(1, 2, 0) * 255).astype(np.uint8)
    cv2.imwrite(str(path), cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
    return rgb.transpose(2, 0, 1).astype(np.float32) / 255


def test_predict_png_from_run_and_from_export(fundus_runs, tmp_path):
    run = fundus_runs["fedavg"]
    models = RunModels(run)
    sm = models.site_model("A")
    images = models.sites["A"].train_images
    inputs = tmp_path / "in"
    inputs.mkdir()
    stored = [_write_png(inputs / f"case{i}.png", images[i]) for i in range(2)]
    big = torch.nn.functional.interpolate(images[2:3], size=(48, 40), mode="bilinear")[0]
    _write_png(inputs / "big.png", big)
    (inputs / "notes.txt").write_text("ignored")
    res = cli.invoke(
        app,
        ["predict", str(run), "--site", "A", "--input", str(inputs), "--out", str(tmp_path / "o")],
    )
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == [
        "big.png",
        "case0.png",
        "case1.png",
    ]
    want = sm.label_maps(torch.from_numpy(np.stack(stored)))
    for i in range(2):
        mask = cv2.imread(str(tmp_path / "o" / f"case{i}.png"), cv2.IMREAD_UNCHANGED)
        assert mask.dtype == np.uint8 and np.array_equal(mask, want[i].numpy())
    big_mask = cv2.imread(str(tmp_path / "o" / "big.png"), cv2.IMREAD_UNCHANGED)
    assert big_mask.shape == (48, 40) and set(np.unique(big_mask)) <= {0, 1, 2}
    assert (big_mask > 0).any()
    cli.invoke(app, ["export", str(run), "--out", str(tmp_path / "x"), "--site", "A"])
    res = cli.invoke(
        app,
        [
            "predict",
            str(tmp_path / "x" / "A.pt"),
            "--input",
            str(inputs),
            "--out",
            str(tmp_path / "e"),
        ],
    )
    assert res.exit_code == 0, res.output
    for name in ("case0.png", "case1.png", "big.png"):
        a, b = (cv2.imread(str(tmp_path / d / name), cv2.IMREAD_UNCHANGED) for d in ("o", "e"))
        assert np.array_equal(a, b)


def test_predict_bad_inputs_name_the_file_and_expectation(fundus_runs, pancreas_run, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    res = cli.invoke(
        app,
        [
            "predict",
            str(fundus_runs["fedavg"]),
            "--site",
            "A",
            "--input",
            str(empty),
            "--out",
            str(tmp_path / "o"),
        ],
    )
    assert res.exit_code == 2 and "no images" in res.output
    pngs = tmp_path / "png"
    pngs.mkdir()
    cv2.imwrite(str(pngs / "x.png"), np.zeros((16, 16), np.uint8))
    sm = RunModels(pancreas_run).site_model("A")
    with pytest.raises(DataError, match=r"x\.png: a 2D image; .* 3D and needs NIfTI"):
        predict_files(sm, pngs, tmp_path / "o")
    vols = tmp_path / "vols"
    vols.mkdir()
    nib.save(nib.Nifti1Image(np.zeros((8, 8, 8, 2), np.float32), np.eye(4)), vols / "two.nii.gz")
    with pytest.raises(DataError, match=r"two\.nii\.gz: image must be a 3D volume"):
        predict_files(sm, vols, tmp_path / "o")
    one = tmp_path / "one"
    one.mkdir()
    nib.save(nib.Nifti1Image(np.zeros((8, 8, 8), np.float32), np.eye(4)), one / "v.nii.gz")
    fundus = RunModels(fundus_runs["fedavg"]).site_model("A")
    with pytest.raises(DataError, match=r"v\.nii\.gz: has 1 channel\(s\), .* expects 3"):
        predict_files(fundus, one, tmp_path / "o")
    res = cli.invoke(app, ["predict", str(pancreas_run), "--input", str(vols), "--out", "o"])
    assert res.exit_code == 2 and "--site is needed" in res.output


def test_sliding_window_covers_volumes_larger_than_the_training_size(pancreas_run):
    models = RunModels(pancreas_run)
    sm = models.site_model("A")
    results = json.loads((pancreas_run / "results.json").read_text())
    acc = MetricAccumulator(models.manifest.regions)
    acc.add(sm.label_maps(models.sites["A"].test_images), models.sites["A"].test_masks)
    assert acc.aggregate()["dsc"] == pytest.approx(results["sites"]["A"]["dsc"], abs=1e-12)
    images = models.sites["A"].test_images[:2]
    assert images.shape[2:] == (16, 16, 16)
    one = sm.label_maps(images)
    long = torch.cat([images[0], images[1]], dim=1)  # [1, 32, 16, 16]: two windows, no overlap
    assert torch.equal(window_labels(sm, long, overlap=0.0), torch.cat([one[0], one[1]]))
    small = window_labels(sm, images[0][:, :12])  # smaller than a window: padded, then cut
    assert small.shape == (12, 16, 16)


def test_predict_nifti_keeps_the_input_header_and_orientation(pancreas_run, tmp_path):
    sm = RunModels(pancreas_run).site_model("B")
    rng = np.random.default_rng(0)
    vol = rng.random((20, 24, 36)).astype(np.float32)  # x, y, z: z is the first model axis
    vol[5:15, 8:16, 10:26] += 1.0
    ras = np.diag([1.5, 1.5, 2.0, 1.0])
    flipped = ras @ np.diag([-1.0, 1.0, -1.0, 1.0])
    flipped[:3, 3] = [1.5 * 19, 0, 2.0 * 35]  # same world positions, x and z stored reversed
    inputs = tmp_path / "in"
    inputs.mkdir()
    nib.save(nib.Nifti1Image(vol, ras), inputs / "ras.nii.gz")
    nib.save(nib.Nifti1Image(vol[::-1, :, ::-1].copy(), flipped), inputs / "las.nii")
    written = predict_files(sm, inputs, tmp_path / "out", overlap=0.25)
    assert sorted(p.name for p in written) == ["las.nii.gz", "ras.nii.gz"]
    a, b = (nib.load(tmp_path / "out" / n) for n in ("ras.nii.gz", "las.nii.gz"))
    assert np.allclose(a.affine, ras) and np.allclose(b.affine, flipped)
    assert a.get_data_dtype() == np.uint8 and a.shape == vol.shape
    la, lb = np.asarray(a.dataobj), np.asarray(b.dataobj)
    assert set(np.unique(la)) <= {0, 1}
    assert np.array_equal(la, lb[::-1, :, ::-1])  # one prediction, stored in each file's order
    resized = predict_files(sm, inputs, tmp_path / "resized", fit="resize")
    assert nib.load(resized[0]).shape == vol.shape
