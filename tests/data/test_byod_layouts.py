"""docs/byod.md: every documented command, run verbatim on a fixture in that layout.

Each test writes a few made-up images or volumes in one public data set's folder layout into
``tmp_path``, runs the command parsed out of docs/byod.md (so the page and the test cannot
drift apart) and checks the imported federation: sites, cases, classes and label values.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import cv2
import nibabel as nib
import numpy as np
import pytest
from typer.testing import CliRunner

from fedseg.cli import app
from fedseg.data import FederatedDataset, check_federation

DOC = Path(__file__).resolve().parents[2] / "docs" / "byod.md"


def documented() -> dict[str, list[str]]:
    """Recipe name -> argv of the ```bash block after its ``<!-- byod: NAME -->`` marker."""
    blocks = re.findall(r"<!-- byod: (\w+) -->\n```bash\n(.*?)```", DOC.read_text(), re.S)
    return {name: shlex.split(body.replace("\\\n", " ")) for name, body in blocks}


def run_recipe(name: str, root: Path, monkeypatch: pytest.MonkeyPatch) -> FederatedDataset:
    """Run recipe ``name`` in ``root`` (where its fixture lies); the federation it wrote."""
    argv = documented()[name]
    assert argv[0] == "fedseg" and argv[1] == "data", argv
    monkeypatch.chdir(root)
    result = CliRunner().invoke(app, argv[1:])
    assert result.exit_code == 0, result.output
    out = argv[argv.index("--out") + 1] if "--out" in argv else argv[4]
    fed = FederatedDataset.open(root / out)
    assert check_federation(fed) == []
    return fed


def splits(fed: FederatedDataset) -> dict[str, tuple[int, int, int]]:
    return {
        s.name: (s.splits["train"], s.splits["val"], s.splits["test"]) for s in fed.manifest.sites
    }


def all_masks(fed: FederatedDataset, site: str) -> np.ndarray:
    parts = [fed.load(site, s).masks.numpy() for s in ("train", "val", "test")]
    return np.concatenate([p for p in parts if len(p)])


def write(path: Path, image: np.ndarray, quality: int | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    params = [cv2.IMWRITE_JPEG_QUALITY, quality] if quality else []
    assert cv2.imwrite(str(path), image, params)


def photo(rng: np.random.Generator, h: int, w: int, channels: int = 3) -> np.ndarray:
    return rng.integers(0, 256, (h, w, channels) if channels == 3 else (h, w), np.uint8)


def disc_mask(rng: np.random.Generator, size: int) -> np.ndarray:
    """Class map 0 background, 1 cup, 2 rim: a disc ellipse holding a smaller cup."""
    mask = np.zeros((size, size), np.uint8)
    c = int(rng.integers(size // 2 - 3, size // 2 + 3))
    cv2.circle(mask, (c, c), size // 3, 2, -1)
    cv2.circle(mask, (c, c), size // 6, 1, -1)
    return mask


def blob(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    mask = np.zeros((h, w), np.uint8)
    center = (int(rng.integers(w // 3, 2 * w // 3)), int(rng.integers(h // 3, 2 * h // 3)))
    cv2.ellipse(mask, center, (w // 5, h // 6), float(rng.uniform(0, 180)), 0, 360, 1, -1)
    return mask


def test_every_recipe_has_a_test() -> None:
    """A recipe added to docs/byod.md needs its ``test_<name>`` here."""
    tests = {n.removeprefix("test_") for n in globals() if n.startswith("test_")}
    assert set(documented()) <= tests, sorted(set(documented()) - tests)
    assert {"fundus", "polyp", "clinicdb", "prostate", "nuclei", "fedicra", "msd"} <= set(
        documented()
    )


def test_fundus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(0)
    expected = {}
    for site in ("Domain1", "Domain2"):
        counts = np.zeros(3, np.int64)
        for split, n in (("train", 2), ("test", 1)):
            for i in range(n):
                classes = disc_mask(rng, 48)
                grey = np.choose(classes, [255, 0, 128]).astype(np.uint8)  # bg, cup, rim
                folder = tmp_path / "fundus" / site / split / "ROIs"
                write(folder / "image" / f"g{site[-1]}_{i:03d}.png", photo(rng, 48, 48))
                write(folder / "mask" / f"g{site[-1]}_{i:03d}.png", grey)
                counts += np.bincount(classes.ravel(), minlength=3)
        expected[site] = counts * 64  # 48 -> 384 px: every pixel an 8 x 8 block
    fed = run_recipe("fundus", tmp_path, monkeypatch)
    m = fed.manifest
    assert m.class_names == ["background", "cup", "rim"] and m.channels == 3
    assert m.regions == {"cup": [1], "disc": [1, 2]} and m.spatial_shape == (384, 384)
    assert splits(fed) == {"Domain1": (2, 0, 1), "Domain2": (2, 0, 1)}
    for site, counts in expected.items():
        np.testing.assert_array_equal(np.bincount(all_masks(fed, site).ravel()), counts)


def test_polyp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(1)
    layout = {  # site: (images dir, masks dir, mask prefix, extension)
        "Kvasir-SEG": ("images", "masks", "", ".jpg"),
        "CVC-ClinicDB": ("Original", "Ground Truth", "", ".tif"),
        "ETIS-LaribPolypDB": ("ETIS-LaribPolypDB", "GroundTruth", "p", ".tif"),
        "CVC-ColonDB": ("images", "masks", "", ".png"),
    }
    area = {}
    for site, (images, masks, prefix, ext) in layout.items():
        area[site] = 0
        for i in range(1, 6):
            mask = blob(rng, 48, 64)
            area[site] += int(mask.sum()) * 8 * 6  # 48 x 64 -> 384 x 384
            quality = 75 if ext == ".jpg" else None  # JPEG masks blur the edges
            write(tmp_path / "polyp" / site / images / f"{i}{ext}", photo(rng, 48, 64), quality)
            write(tmp_path / "polyp" / site / masks / f"{prefix}{i}{ext}", mask * 255, quality)
    fed = run_recipe("polyp", tmp_path, monkeypatch)
    assert fed.manifest.class_names == ["background", "polyp"]
    assert splits(fed) == {site: (4, 0, 1) for site in layout}
    for site, pixels in area.items():
        masks = all_masks(fed, site)
        assert set(np.unique(masks).tolist()) == {0, 1}
        if site == "Kvasir-SEG":  # thresholded JPEG: within 3 % of the drawn area
            assert int(masks.sum()) == pytest.approx(pixels, rel=0.03)
        else:
            assert int(masks.sum()) == pixels


def test_clinicdb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(2)
    for site in ("seq01-10", "seq11-20"):
        for i in range(5):
            write(tmp_path / "clinicdb" / site / "Original" / f"{i}.tif", photo(rng, 36, 48))
            mask = blob(rng, 36, 48) * 255
            write(tmp_path / "clinicdb" / site / "Ground Truth" / f"{i}.tif", mask)
    fed = run_recipe("clinicdb", tmp_path, monkeypatch)
    assert fed.manifest.spatial_shape == (288, 384)
    assert splits(fed) == {"seq01-10": (3, 1, 1), "seq11-20": (3, 1, 1)}
    assert set(np.unique(all_masks(fed, "seq01-10")).tolist()) == {0, 1}


def prostate_case(folder: Path, case: str, voxel: float, suffix: str, value: int) -> None:
    """A 40 mm field of view at ``voxel`` mm in-plane (3 mm slices) with a 10 mm square
    prostate labelled ``value`` in slices 1 and 2 of 4; T2-like grey values."""
    n, k = round(40 / voxel), round(10 / voxel)
    label = np.zeros((n, n, 4), np.uint8)
    lo = round(15 / voxel)  # the square spans 15..25 mm
    label[lo : lo + k, lo : lo + k, 1:3] = value
    image = np.where(label > 0, 300.0, 100.0) + np.random.default_rng(n).normal(0, 5, label.shape)
    affine = np.diag([voxel, voxel, 3.0, 1.0])
    folder.mkdir(parents=True, exist_ok=True)
    nib.save(nib.Nifti1Image(image.astype(np.float32), affine), folder / f"{case}.nii.gz")
    nib.save(nib.Nifti1Image(label, affine), folder / f"{case}{suffix}.nii.gz")


def test_prostate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sites = {"BIDMC": (0.25, "_segmentation", 1), "HK": (0.625, "_Segmentation", 2),
             "UCL": (0.4, "_segmentation", 1)}  # fmt: skip
    for site, (voxel, suffix, value) in sites.items():
        for c in range(3):
            prostate_case(tmp_path / "prostate" / site, f"Case{c:02d}", voxel, suffix, value)
    fed = run_recipe("prostate", tmp_path, monkeypatch)
    assert fed.manifest.class_names == ["background", "prostate"]
    assert fed.manifest.spatial_shape == (384, 384)
    assert splits(fed) == {s: (4, 0, 2) for s in sites}  # 2 slices per case, 1 test case
    for site in sites:
        split = fed.load(site, "train")
        np.testing.assert_allclose(split.spacing, 0.5)
        # the 10 mm prostate is 20 x 20 px at 0.5 mm at every site, whatever its voxel size
        assert [int(m.sum()) for m in split.masks] == [400] * 4


def monuseg_xml(path: Path, squares: list[tuple[int, int, int]]) -> None:
    """ImageScope XML with one square region (row, col, side) per nucleus."""
    regions = "".join(
        f'<Region Id="{i}"><Vertices>'
        + "".join(
            f'<Vertex X="{x}" Y="{y}" />'
            for y, x in ((r, c), (r, c + s), (r + s, c + s), (r + s, c))
        )
        + "</Vertices></Region>"
        for i, (r, c, s) in enumerate(squares, start=1)
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'<?xml version="1.0"?><Annotations><Annotation Id="1"><Regions>{regions}'
                    "</Regions></Annotation></Annotations>")  # fmt: skip


def test_nuclei(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(3)
    for i in range(5):
        name = f"TCGA-{i:02d}-A13E-01Z-00-DX1"
        write(tmp_path / "nuclei" / "MoNuSeg" / "Tissue Images" / f"{name}.tif", photo(rng, 64, 64))
        monuseg_xml(tmp_path / "nuclei" / "MoNuSeg" / "Annotations" / f"{name}.xml",
                    [(8, 8, 10), (30, 40, 12)])  # fmt: skip
        instances = np.zeros((64, 64), np.uint16)
        for k, (r, c) in enumerate(((5, 5), (5, 30), (40, 20)), start=1):
            instances[r : r + 8, c : c + 8] = k * 100  # instance ids, some above 255
        write(tmp_path / "nuclei" / "TNBC" / "images" / f"{i:02d}_1.png", photo(rng, 64, 64))
        write(tmp_path / "nuclei" / "TNBC" / "masks" / f"{i:02d}_1.png", instances)
    fed = run_recipe("nuclei", tmp_path, monkeypatch)
    assert fed.manifest.class_names == ["background", "nuclei"]
    assert splits(fed) == {"MoNuSeg": (4, 0, 1), "TNBC": (4, 0, 1)}
    for site in ("MoNuSeg", "TNBC"):
        masks = all_masks(fed, site)
        assert set(np.unique(masks).tolist()) == {0, 1}
    tnbc = all_masks(fed, "TNBC")
    assert int(tnbc.sum()) == 5 * 3 * 8 * 8 * 64  # three 8 px nuclei, 64 -> 512 px
    per_tile = all_masks(fed, "MoNuSeg").reshape(5, -1).sum(axis=1) / 64
    assert np.all((per_tile >= 100 + 144) & (per_tile <= 121 + 169))  # squares of side 10, 12


def test_fedicra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(4)
    for d in range(1, 6):
        for split, n in (("train", 2), ("test", 1)):
            folder = tmp_path / "FAZ" / f"Domain{d}" / split
            for i in range(n):
                name = f"{d}{i:02d}.png"
                faz = blob(rng, 32, 32)
                write(folder / "imgs" / name, photo(rng, 32, 32, channels=1))
                write(folder / "mask" / name, faz * 127)
                if split == "train":  # weak labels: a few labelled pixels, 254 elsewhere
                    for weak_dir in ("scr", "scr_n", "keypoint", "block", "box"):
                        weak = np.full((32, 32), 254, np.uint8)
                        rows, cols = np.nonzero(faz)
                        weak[rows[:5], cols[:5]] = 127
                        weak[0, :8] = 0
                        write(folder / weak_dir / name, weak)
    fed = run_recipe("fedicra", tmp_path, monkeypatch)
    m = fed.manifest
    assert m.class_names == ["background", "faz"] and m.channels == 1
    assert {s.name: s.annotation for s in m.sites} == {
        "Domain1": "scribble2", "Domain2": "point", "Domain3": "block", "Domain4": "box",
        "Domain5": "scribble",
    }  # fmt: skip
    assert m.weak_labels is not None and m.weak_labels.origin == "imported:folder"
    assert all(v == (2, 0, 1) for v in splits(fed).values())
    for site in fed.site_names:
        split = fed.load(site, "train", labels="weak")
        weak, full = split.labels.numpy(), split.masks.numpy()
        assert set(np.unique(weak).tolist()) == {0, 1, 255}
        assert np.all(full[weak == 1] == 1) and np.all(full[weak == 0] == 0)
        assert (weak == 255).mean() > 0.9  # sparse: most pixels unlabeled


def test_msd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    task = tmp_path / "Task05_Prostate"
    training, rows = [], ["case,site"]
    rng = np.random.default_rng(5)
    for c in range(4):
        voxel = 0.6 if c % 2 else 0.4  # the same 9.6 mm field of view at two voxel sizes
        n, pz, tz = (round(v / voxel) for v in (9.6, 2.4, 3.6))
        label = np.zeros((n, n, 4), np.uint8)
        label[pz : n - pz, pz : n - pz, 1:3] = 1  # 4.8 mm peripheral zone
        label[tz : n - tz, tz : n - tz, 1:3] = 2  # 2.4 mm transition zone
        image = np.stack([label * 100.0 + rng.normal(0, 1, label.shape)] * 2, axis=-1)
        for folder, data in (("imagesTr", image.astype(np.float32)), ("labelsTr", label)):
            (task / folder).mkdir(parents=True, exist_ok=True)
            nib.save(nib.Nifti1Image(data, np.diag([voxel, voxel, 3.6, 1.0])),
                     task / folder / f"prostate_{c:02d}.nii.gz")  # fmt: skip
        training.append({"image": f"./imagesTr/prostate_{c:02d}.nii.gz",
                         "label": f"./labelsTr/prostate_{c:02d}.nii.gz"})  # fmt: skip
        rows.append(f"prostate_{c:02d},{'RUNMC' if c < 2 else 'BMC'}")
    meta = {"name": "Prostate", "modality": {"0": "T2", "1": "ADC"},
            "labels": {"0": "background", "1": "PZ", "2": "TZ"}, "training": training}  # fmt: skip
    (task / "dataset.json").write_text(json.dumps(meta))
    (tmp_path / "sites.csv").write_text("\n".join(rows) + "\n")
    fed = run_recipe("msd", tmp_path, monkeypatch)
    m = fed.manifest
    assert m.class_names == ["background", "PZ", "TZ"] and m.channels == 2
    assert m.modality == "T2+ADC" and m.spatial_shape == (128, 128)
    assert splits(fed) == {"BMC": (2, 0, 2), "RUNMC": (2, 0, 2)}  # 2 slices a case
    for site in ("BMC", "RUNMC"):
        masks = all_masks(fed, site)
        # 0.6 mm everywhere: the zones are 8 x 8 px (PZ + TZ) and 4 x 4 px (TZ) in every case
        assert [np.bincount(k.ravel(), minlength=3)[1:].tolist() for k in masks] == [[48, 16]] * 4


# ---------------------------------------------------------------- refusals of the options
def cli_error(root: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> str:
    """Output of a failing ``fedseg data import-folder`` run in ``root``; nothing written."""
    monkeypatch.chdir(root)
    result = CliRunner().invoke(app, ["data", "import-folder", "src", "out", *args])
    assert result.exit_code != 0 and "Traceback" not in result.output, result.output
    assert not (root / "out").exists()
    return " ".join(result.output.split())


@pytest.fixture
def two_sites(tmp_path: Path) -> Path:
    """Site A: images/ + masks/; site B: ETIS-style GroundTruth/p<id>.png; weak labels in A."""
    rng = np.random.default_rng(6)
    for i in range(3):
        mask = blob(rng, 16, 16)
        write(tmp_path / "src" / "A" / "images" / f"{i}.png", photo(rng, 16, 16))
        write(tmp_path / "src" / "A" / "masks" / f"{i}.png", mask * 255)
        write(tmp_path / "src" / "A" / "scr" / f"{i}.png", np.where(mask > 0, 255, 254))
        write(tmp_path / "src" / "B" / "images" / f"{i}.png", photo(rng, 16, 16))
        write(tmp_path / "src" / "B" / "GroundTruth" / f"p{i}.png", mask * 255)
    return tmp_path


BASE = shlex.split("--classes bg,fg --mapping 0=0,255=1 --size 16 --masks-dir B=GroundTruth")
WEAK = "--mask-prefix B=p --weak-dir A=scr --weak-mapping"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ("", "images without mask: ['0', '1', '2'], masks without image: ['p0', 'p1', 'p2']; "
             "near matches: 0 ~ p0, 1 ~ p1, 2 ~ p2"),
        ("--mask-prefix B=p --images-dir C=imgs",
         "per-site layout names unknown site 'C'; sites are ['A', 'B']"),
        ("--mask-prefix B=p --images-dir a --images-dir b",
         "--images-dir takes one value for all sites (others as SITE=VALUE), got ['a', 'b']"),
        ("--mask-prefix B=p --weak-dir A=scr", "--weak-dir needs --weak-mapping"),
        (f"{WEAK} 254=255,255=2", "--weak-mapping classes must be in 0..1 or 255, got [2]"),
        ("--mask-prefix B=p --weak-dir A=masks --weak-mapping 0=0,255=1",
         "--weak-dir A=masks needs --annotation A=TYPE"),
        (f"{WEAK} 254=255,255=1 --annotation B=point",
         "sites ['B'] are weakly annotated but have no --weak-dir"),
        ("--mask-prefix B=p --weak-dir B=scr --weak-mapping 254=255,255=1",
         "expected one weak label 0.png"),
        (f"{WEAK} 254=255", "values [255] are not within 0 of the mapped levels [254]"),
        ("--mask-prefix B=p --weak-dir Z=scr --weak-mapping 254=255,255=1",
         "--weak-dir names unknown sites ['Z']"),
    ],
)  # fmt: skip
def test_folder_option_refusals(
    two_sites: Path, monkeypatch: pytest.MonkeyPatch, args: str, message: str
) -> None:
    assert message in cli_error(two_sites, monkeypatch, *BASE, *args.split())


def test_prefix_any_case_and_weak_folder(two_sites: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(two_sites)
    args = f"{WEAK} 254=255,255=1 --test-fraction 0".replace("B=p", "B=P").split()
    result = CliRunner().invoke(app, ["data", "import-folder", "src", "out", *BASE, *args])
    assert result.exit_code == 0, result.output
    fed = FederatedDataset.open(two_sites / "out")
    assert {s.name: s.annotation for s in fed.manifest.sites} == {"A": "scribble", "B": "full"}
    weak = fed.load("A", "train", labels="weak")
    np.testing.assert_array_equal(weak.labels, np.where(weak.masks == 1, 1, 255))


def test_damaged_xml_mask_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path / "src" / "A" / "images" / "t.png", photo(np.random.default_rng(7), 8, 8))
    (tmp_path / "src" / "A" / "masks").mkdir()
    (tmp_path / "src" / "A" / "masks" / "t.xml").write_text('<Annotations><Vertex X="a"')
    text = cli_error(tmp_path, monkeypatch, "--classes", "bg,fg", "--mapping", "0=0,255=1")
    assert "masks/t.xml: not an ImageScope annotation XML" in text
