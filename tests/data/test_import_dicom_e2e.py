"""A hospital's path end to end: a three-site CT federation in DICOM (DICOM-SEG masks at one
site, RT Structure Sets at another, SEG at the third) imports, trains a tiny federated run,
predicts a DICOM-SEG for a new series and reads it back."""

from __future__ import annotations

from pathlib import Path

import highdicom as hd
import numpy as np
import pytest
from typer.testing import CliRunner

from dicom_fixtures import box_contour, ct_series, rtstruct_file, seg_file
from fedseg.cli import app
from fedseg.data import FederatedDataset, check_federation
from fedseg.data.importers.dicom import read_series
from fedseg.data.importers.dicom_seg import read_seg

runner = CliRunner()


def case(rng: np.random.Generator, contrast: float) -> tuple[np.ndarray, tuple[int, ...]]:
    """A 6 x 20 x 20 CT of soft tissue (40 HU, noise) with a brighter box organ; the box."""
    hu = rng.normal(40, 15, (6, 20, 20))
    r0, c0 = rng.integers(3, 8, 2)
    box = (int(r0), int(r0) + 8, int(c0), int(c0) + 7)
    hu[1:5, box[0] : box[1] + 1, box[2] : box[3] + 1] += contrast
    return np.rint(hu).astype(np.int16), box


def write_site(root: Path, site: str, contrast: float, kind: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for k in range(3):
        hu, (r0, r1, c0, c1) = case(rng, contrast)
        folder = root / site / f"study{k}"
        series = ct_series(folder / "ct", hu, institution=site, patient=f"{site}{k}")
        mask = np.zeros(hu.shape, np.uint8)
        mask[1:5, r0 : r1 + 1, c0 : c1 + 1] = 1
        if kind == "seg":
            seg_file(folder / "seg.dcm", series, mask, ["Liver"])
        else:
            contours = {z: [box_contour(series[z], r0, r1, c0, c1)] for z in range(1, 5)}
            rtstruct_file(folder / "rtstruct.dcm", series, {"LIVER_GTV": contours})


@pytest.mark.slow  # about 30 s, most of it the run's start-up and outputs
def test_three_site_dicom_ct_federation_imports_trains_and_predicts_dicom_seg(
    tmp_path: Path,
) -> None:
    src = tmp_path / "pacs"
    for seed, (site, contrast, kind) in enumerate(
        [("HospA", 120, "seg"), ("HospB", 160, "rtstruct"), ("HospC", 200, "seg")]
    ):
        write_site(src, site, contrast, kind, seed)
    fed = tmp_path / "fed"
    done = runner.invoke(
        app,
        [
            *("data", "import-dicom", str(src), str(fed), "--classes", "background,liver"),
            *("--roi", "LIVER_GTV=liver", "--ct-window=-100,300", "--shape", "20"),
            *("--test-fraction", "0.34", "--keep-empty"),
        ],
    )
    assert done.exit_code == 0, done.output
    federation = FederatedDataset.open(fed)
    assert federation.site_names == ["HospA", "HospB", "HospC"]
    assert federation.manifest.modality == "CT" and not check_federation(federation)
    assert all(len(v) == 3 for v in federation.manifest.series.values())

    config = tmp_path / "run.yaml"
    config.write_text(
        f"name: dicom\nseed: 0\ndata: {{root: {fed}, labels: full}}\nmethod: {{name: fedavg}}\n"
        "model: {widths: [4, 8], dropout: [0.0, 0.0]}\n"
        "train: {rounds: 1, local_iters: 2, batch_size: 4}\neval: {save_models: false}\n"
    )
    done = runner.invoke(app, ["run", str(config), "--out", str(tmp_path / "run")])
    assert done.exit_code == 0, done.output

    new = tmp_path / "new" / "HospA"
    hu, _ = case(np.random.default_rng(9), 120)
    ct_series(new, hu)
    done = runner.invoke(
        app,
        [
            *("predict", str(tmp_path / "run"), "--site", "HospA", "--input", str(new)),
            *("--out", str(tmp_path / "masks"), "--format", "dicom-seg", "--ct-window=-100,300"),
        ],
    )
    assert done.exit_code == 0, done.output
    (path,) = (tmp_path / "masks").glob("*.dcm")
    (series,) = read_series(new)
    seg = hd.seg.segread(path)
    assert seg.ReferencedSeriesSequence[0].SeriesInstanceUID == series.uid
    assert seg.get_segment_description(1).segment_label == "liver"
    labels = read_seg(path, series, {1: 1})
    assert labels.shape == series.shape and set(np.unique(labels)) <= {0, 1}

    # the prediction, beside its series, imports back as that mask
    path.rename(new / "prediction.dcm")
    done = runner.invoke(
        app,
        [
            *("data", "import-dicom", str(new.parent), str(tmp_path / "back")),
            *("--classes", "background,liver", "--mode", "3d", "--shape", "6,20,20"),
            *("--ct-window=-100,300", "--test-fraction", "0"),
        ],
    )
    assert done.exit_code == 0, done.output
    (sample,) = (np.load(p) for p in (tmp_path / "back").rglob("*.npz"))
    back = sample["mask"]  # RAS, axial axis first: (z, x, y) of the (z, y, x) DICOM grid
    assert np.array_equal(back, labels.transpose(0, 2, 1)[:, ::-1, ::-1])
