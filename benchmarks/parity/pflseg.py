"""Parity driver for jcwang123/PFL-Seg-Trans @ d715417c (FedDP's code) on a fedseg federation.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/parity/pflseg.py --data data/polyp \
        --fl ours_q --seed 0 --rounds 40 --out runs/parity/pflseg/ours_q/seed0

1. Writes the federation's 4 sites, in manifest order, as its ``polyp`` reader takes them:
   ``polyp/Site{k}/{train,test}/{image,mask}/<case id>.npy``; images H x W x 3 float32 at
   255 x fedseg's values (its loader divides by 255: the inputs are fedseg's own), masks 0/1.
   fedseg's validation split is left out. ``case_map.json`` maps the files to fedseg's cases.
2. Generates ``weights/pvt_v2_b0.pth`` (its ImageNet checkpoint cannot be downloaded here)
   from its own ``pvt_v2_b0()`` after ``torch.manual_seed(--seed)``, kept beside the run for
   the fedseg arm to load, and runs ``scripts/train_fed.py --net pvtb0_fpn --dataset polyp
   --fl F --max_epoch N --base_lr 1e-3`` from an export of the pinned commit in its own venv
   (``runs/parity/venv-pflseg``) with ``shims/pflseg`` on ``PYTHONPATH`` (README.md).
   Its ``Dataset.__len__`` is 300: each round is 300 random draws (with replacement) per
   site (38 batches of 8), whatever the site's size; the fedseg arm must mirror that.
3. Scores the last round's per-site models with fedseg's metrics into ``--out`` and the
   round it keeps (one choice for all sites: the best mean over sites of its test Jaccard,
   its ``Site{k}_best.pth``) into ``--out/best_round``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
from common import (
    RUNS,
    Code,
    add_predictions,
    arm_config,
    export,
    parity_env,
    parity_parser,
    read_case_map,
    run_logged,
    write_case_map,
    write_round_pick,
)

from fedseg.data import FederatedDataset

CODE = Code("jcwang123/PFL-Seg-Trans", "d715417c")
FL = {"fedavg": "fedavg", "fedrep": "fedrep", "fedbabu": "fedbabu", "ours_q": "feddp"}
"""Its ``--fl`` -> the fedseg method it is compared with (``ours_q``: FedDP before its
fine-tuning step ``train_ft.py``, which this driver does not run)."""
CAPTURE = re.compile(r"site(\d+)_round(\d+)\.npz")
SITES = 4


def write_layout(fed_root: Path, data: Path) -> None:
    """Write the federation at ``data`` (what its prefix is redirected to)."""
    fed = FederatedDataset.open(fed_root)
    sites = fed.manifest.sites
    if len(sites) != SITES or fed.manifest.num_classes != 2 or fed.manifest.channels != 3:
        raise SystemExit(
            f"{fed_root}: its polyp reader takes {SITES} sites, 2 classes and 3 channels; got "
            f"{len(sites)}, {fed.manifest.num_classes}, {fed.manifest.channels}"
        )
    shutil.rmtree(data, ignore_errors=True)
    mapping = {}
    for k, site in enumerate(sites):
        for part in ("train", "test"):
            split = fed.load(site.name, part, "full")
            for sub in ("image", "mask"):
                (data / "polyp" / f"Site{k + 1}" / part / sub).mkdir(parents=True)
            for i, cid in enumerate(split.ids):
                name = f"polyp/Site{k + 1}/{part}/image/{cid}.npy"
                np.save(data / name, split.images[i].numpy().transpose(1, 2, 0) * 255.0)
                np.save(data / name.replace("/image/", "/mask/"), split.masks[i].numpy() > 0)
                mapping[name] = (site.name, cid)
    write_case_map(data, mapping)


def read_captures(
    capture: Path, data: Path, rounds: int
) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, dict[str, np.ndarray]], int]:
    """The last round's and its best round's predictions and the best round (0-based;
    its rule: the first round whose mean over sites of mean test Jaccard is highest)."""
    files: dict[int, dict[int, Path]] = {}
    for f in capture.glob("site*_round*.npz"):
        if m := CAPTURE.fullmatch(f.name):
            files.setdefault(int(m[2]), {})[int(m[1])] = f
    if sorted(files) != list(range(rounds)) or any(len(v) != SITES for v in files.values()):
        raise SystemExit(f"{capture}: not every site evaluated in rounds 0 to {rounds - 1}")
    overall = {
        r: np.mean([float(np.load(f)["jaccard"]) for f in v.values()]) for r, v in files.items()
    }
    best, top = 0, 0.0
    for r in sorted(overall):  # `overall_score > best_score`, best_score starting at 0
        if overall[r] > top:
            best, top = r, overall[r]
    case_map = read_case_map(data)
    out = []
    for r in (rounds - 1, best):
        preds: dict[str, dict[str, np.ndarray]] = {}
        for f in files[r].values():
            add_predictions(preds, f, case_map)
        out.append(preds)
    return out[0], out[1], best


def main() -> None:
    ap = parity_parser(__doc__, CODE, "venv-pflseg", "train_fed.py")
    ap.add_argument("--fl", choices=sorted(FL), required=True)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--batch", type=int, default=8, help="its --batch_size (default 8)")
    args = ap.parse_args()
    cfg = arm_config(
        f"parity-pflseg-{args.fl}",
        {"name": FL[args.fl]},
        args.data,
        labels="full",
        seed=args.seed,
        train={"rounds": args.rounds, "batch_size": args.batch, "lr": args.lr},
        like=args.like,
    )
    work = args.work or RUNS / "work" / f"pflseg-{args.fl}-s{args.seed}"
    code = export(CODE, args.git_dir, work / "code")
    data, capture = (work / "data").resolve(), (work / "capture").resolve()
    write_layout(args.data, data)
    shutil.rmtree(capture, ignore_errors=True)
    env = parity_env("pflseg", FEDSEG_PARITY_DATA=str(data), FEDSEG_PARITY_CAPTURE=str(capture))
    (code / "weights").mkdir(exist_ok=True)
    weights = (
        f"import torch; torch.manual_seed({args.seed}); from networks.FPN.pvtv2 import pvt_v2_b0; "
        "torch.save(pvt_v2_b0().state_dict(), 'weights/pvt_v2_b0.pth')"
    )
    subprocess.run([args.python, "-c", weights], cwd=code, env=env, check=True)
    shutil.copy(code / "weights" / "pvt_v2_b0.pth", work / "pvt_v2_b0.pth")
    cmd = [
        "--fl", args.fl, "--net", "pvtb0_fpn", "--dataset", "polyp", "--ver", f"s{args.seed}",
        "--max_epoch", str(args.rounds), "--base_lr", str(args.lr), "--seed", str(args.seed),
        "--batch_size", str(args.batch),
        "--gpu", "0", *args.extra,
    ]  # fmt: skip
    argv = [args.python, "scripts/train_fed.py", *cmd]
    wall = run_logged(argv, code, env, work / "train_fed.out", args.timeout)
    initial = str((work / "pvt_v2_b0.pth").resolve())
    write_round_pick(
        args,
        read_captures(capture, data, args.rounds),
        cfg,
        CODE.provenance("scripts/train_fed.py", cmd, initial_weights=initial),
        "its best round on test: the first best mean over sites of its test Jaccard",
        wall,
    )


if __name__ == "__main__":
    main()
