"""The ``fedseg data`` commands through Typer's CliRunner."""

from __future__ import annotations

import json
from pathlib import Path

from test_importers import write_case, write_fundus_site, write_h5
from typer.testing import CliRunner

from fedseg.data import FederatedDataset, check_federation
from fedseg.data.cli import app

runner = CliRunner()


def run(*args: str | Path, code: int = 0) -> str:
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == code, result.output
    return result.output


def test_synth_check_weak_labels_preview(tmp_path: Path) -> None:
    root = tmp_path / "fed"
    out = run(
        "synth",
        "--task",
        "prostate",
        "--out",
        root,
        "--sites",
        "3",
        "--size",
        "32",
        "--per-site",
        "8",
        "--seed",
        "2",
    )
    assert "block" in out and "sparse" in out and "not patient data" in out
    assert FederatedDataset.open(root).manifest.weak_labels.seed == 2
    assert "no problems" in run("check", root, "--batch-size", "2", "--labels", "weak")
    gone = sorted((root / "sites" / "B" / "train" / "weak").glob("*.npy"))[0]
    gone.unlink()  # one weak label of a weakly annotated site lost: found without --labels
    out = run("check", root, code=1)
    assert f"weak labels missing for {gone.stem}" in out
    run("weak-labels", root, "--seed", "2")
    out = run("check", root, "--batch-size", "50", code=1)
    assert "fewer than the batch size 50" in out
    run("weak-labels", root, "--seed", "3", "--annotation", "A=box", "--box-to", "scribble")
    m = FederatedDataset.open(root).manifest
    assert (m.sites[0].annotation, m.sites[0].sparsity, m.box_conversion) == (
        "box",
        "medium",
        "scribble",
    )
    out = run("preview", root, "--out", tmp_path / "png", "--n", "2")
    pngs = sorted((tmp_path / "png").glob("*.png"))
    assert [p.stem for p in pngs] == ["A", "B", "C"] and "wrote" in out
    assert pngs[0].read_bytes()[:4] == b"\x89PNG"


def test_synth_without_weak_labels_and_errors(tmp_path: Path) -> None:
    root = tmp_path / "fed"
    run(
        "synth",
        "--task",
        "faz",
        "--out",
        root,
        "--sites",
        "2",
        "--size",
        "16",
        "--per-site",
        "5",
        "--no-weak-labels",
    )
    assert FederatedDataset.open(root).manifest.weak_labels is None
    out = run("check", root, "--labels", "weak", code=1)
    assert "fedseg data weak-labels" in out
    # by default the check asks for what the manifest declares: weak sites need weak labels
    assert run("check", root, code=1) == out
    assert "no problems" in run("check", root, "--labels", "full")
    out = run("synth", "--task", "faz", "--out", root, code=2)
    assert "error:" in out and "--overwrite" in out
    assert "unknown synthetic task 'retina'" in run(
        "synth", "--task", "retina", "--out", tmp_path / "x", code=2
    )
    assert "SITE=VALUE" in run("weak-labels", root, "--annotation", "A", code=2)
    assert "does not exist" in run("check", tmp_path / "nowhere", code=2)
    assert "--batch-size must be at least 1, got 0" in run(
        "check", root, "--batch-size", "0", code=2
    )


def test_import_commands(tmp_path: Path) -> None:
    for site in ("Domain1", "Domain2"):
        write_h5(tmp_path / "h5", site, "train", 4, weak=True)
        write_h5(tmp_path / "h5", site, "test", 1, weak=False)
    out = run(
        "import-h5",
        tmp_path / "h5",
        tmp_path / "a",
        "--classes",
        "bg,faz",
        "--task",
        "faz",
        "--weak-key",
        "Domain1=scribble",
        "--annotation",
        "Domain2=point",
    )
    assert "scribble" in out and "point" in out
    assert check_federation(FederatedDataset.open(tmp_path / "a"), labels="weak") == []

    write_fundus_site(tmp_path / "png" / "refuge", 4, ".png")
    run(
        "import-folder",
        tmp_path / "png",
        tmp_path / "b",
        "--classes",
        "bg,cup,rim",
        "--mapping",
        "0=0,255=1,128=2",
        "--size",
        "20,24",
        "--region",
        "disc=1,2",
        "--region",
        "cup=1",
    )
    m = FederatedDataset.open(tmp_path / "b").manifest
    assert m.spatial_shape == (20, 24) and m.regions == {"disc": [1, 2], "cup": [1]}

    for i in range(3):
        write_case(tmp_path / "nii" / "ucl", f"c{i}", i)
    out = run(
        "import-nifti",
        tmp_path / "nii",
        tmp_path / "c",
        "--classes",
        "bg,prostate",
        "--mapping",
        "0=0,255=1",
        "--shape",
        "16",
        "--test-fraction",
        "0.34",
    )
    assert "dropped 18 slices with empty masks" in out
    run(
        "import-nifti",
        tmp_path / "nii",
        tmp_path / "d",
        "--classes",
        "bg,prostate",
        "--mapping",
        "0=0,255=1",
        "--mode",
        "3d",
        "--shape",
        "8,16,16",
        "--fit",
        "crop",
    )
    split = FederatedDataset.open(tmp_path / "d").load("ucl", "train")
    assert split.images.shape[1:] == (1, 8, 16, 16)
    assert "--shape needs 1 or 3 positive sizes" in run(
        "import-nifti",
        tmp_path / "nii",
        tmp_path / "e",
        "--classes",
        "bg,p",
        "--mode",
        "3d",
        "--shape",
        "8,16",
        code=2,
    )


def test_check_reports_broken_manifest(tmp_path: Path) -> None:
    root = tmp_path / "fed"
    run(
        "synth",
        "--task",
        "polyp",
        "--out",
        root,
        "--sites",
        "1",
        "--size",
        "16",
        "--per-site",
        "5",
        "--no-weak-labels",
    )
    data = json.loads((root / "manifest.json").read_text())
    data["channels"] = 0
    (root / "manifest.json").write_text(json.dumps(data))
    out = run("check", root, code=2)
    assert "manifest.json" in out and "invalid manifest" in out and "channels" in out
