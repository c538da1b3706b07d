"""Parity driver for zxy1234321/FedBCS @ f2034353: the authors' code on a fedseg federation.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/parity/fedbcs.py --data data/nuclei4-64 \
        --arch fsr --seed 0 --rounds 40 --out runs/parity/fedbcs/fsr/seed0 [-- --infoNCET 0.005]

1. Writes the federation's 4 sites, in manifest order, as its ``tnbc`` reader's
   ``example`` source takes them: ``data/{TCIA,CRC,KIRC,TNBC}/{train,val}.txt``, lines
   ``<img>.png <mask>.png`` relative to ``data/``; images 16-bit PNG (each image's range
   mapped to 0..65535: its ``ScaleIntensityd`` rescales every image to [0, 1] anyway), masks
   0/1. fedseg's test split is their ``val`` list (what they evaluate every round); fedseg's
   validation split is left out. ``case_map.json`` maps the list entries to fedseg's cases.
2. Runs ``main.py --model fedbcs --dataset tnbc --source_key example --local_epoch 1`` from
   an export of the pinned commit in its own venv (``runs/parity/venv-fedbcs``) with
   ``shims/fedbcs`` on ``PYTHONPATH`` (README.md): its ``Resized(256)`` set to the
   federation's size, and a recorder of the global model's test predictions per round.
   Its ``best_args`` fix SGD, lr 0.01 and batch 6 whatever the command line says.
   ``--seed`` is its ``--seed`` (it seeds random, numpy, torch and MONAI).
3. Scores the last round's global model with fedseg's metrics into ``--out``, and the round
   its code ranks first (the mean over domains of MONAI's class-1 Dice on the val lists)
   into ``--out/best_round``.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import cv2
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

CODE = Code("zxy1234321/FedBCS", "f2034353")
DOMAINS = ("TCIA", "CRC", "KIRC", "TNBC")
"""Its ``TNBCDataset.DOMAINS_LIST`` order (``tcia, crc, kirc, tnbc``), their folder names."""
CAPTURE = re.compile(r"round(\d+)\.npz")


def write_layout(fed_root: Path, data: Path) -> None:
    """Write the federation at ``data`` (the code's ``./data``) as its list files."""
    fed = FederatedDataset.open(fed_root)
    sites = fed.manifest.sites
    if len(sites) != len(DOMAINS) or fed.manifest.num_classes != 2 or fed.manifest.channels < 3:
        raise SystemExit(
            f"{fed_root}: its nuclei reader takes {len(DOMAINS)} sites, 2 classes and >= 3 "
            f"channels; got {len(sites)}, {fed.manifest.num_classes}, {fed.manifest.channels}"
        )
    shutil.rmtree(data, ignore_errors=True)
    mapping = {}
    for domain, site in zip(DOMAINS, sites, strict=True):
        for part, theirs in (("train", "train"), ("test", "val")):
            (data / domain / theirs).mkdir(parents=True)
            split = fed.load(site.name, part, "full")
            lines = []
            for i, cid in enumerate(split.ids):
                img = split.images[i].numpy().transpose(1, 2, 0)
                lo, hi = float(img.min()), float(img.max())
                img16 = np.round((img - lo) / max(hi - lo, 1e-12) * 65535).astype(np.uint16)
                name = f"{domain}/{theirs}/{cid}.png"
                cv2.imwrite(str(data / name), img16)
                cv2.imwrite(
                    str(data / f"{domain}/{theirs}/{cid}_mask.png"),
                    split.masks[i].numpy().astype(np.uint8),
                )
                lines.append(f"{name} {domain}/{theirs}/{cid}_mask.png\n")
                mapping[name] = (site.name, cid)
            (data / domain / f"{theirs}.txt").write_text("".join(lines))
    write_case_map(data, mapping)


def read_captures(
    capture: Path, data: Path, rounds: int
) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, dict[str, np.ndarray]], int]:
    """The last round's and its best round's predictions ``{site: {case id: label map}}``
    and the best round (0-based ``epoch_index``, the first of equal scores)."""
    files = {int(m[1]): f for f in capture.glob("round*.npz") if (m := CAPTURE.fullmatch(f.name))}
    if sorted(files) != list(range(rounds)):
        raise SystemExit(f"{capture}: evaluated rounds {sorted(files)}, expected 0 to {rounds - 1}")
    # its ranking key: the mean over domains of class-1 Dice, rounded to 5 places
    score = {r: round(float(np.mean(np.load(f)["class1_dice"])), 5) for r, f in files.items()}
    best = max(score, key=lambda r: (score[r], -r))
    case_map = read_case_map(data)
    out = []
    for r in (rounds - 1, best):
        preds: dict[str, dict[str, np.ndarray]] = {}
        add_predictions(preds, files[r], case_map)
        out.append(preds)
    return out[0], out[1], best


def main() -> None:
    ap = parity_parser(__doc__, CODE, "venv-fedbcs", "its main.py")
    ap.add_argument("--arch", choices=["fsr", "unet"], default="fsr", help="unet: without FSR")
    args = ap.parse_args()
    method = {"name": "fedbcs", "fsr": args.arch == "fsr"}
    train = {"rounds": args.rounds, "local_epochs": 1, "batch_size": 6, "lr": 0.01}
    cfg = arm_config(
        f"parity-fedbcs-{args.arch}",
        method,
        args.data,
        labels="full",
        seed=args.seed,
        train=train,
        like=args.like,
    )
    work = args.work or RUNS / "work" / f"fedbcs-{args.arch}-s{args.seed}"
    code = export(CODE, args.git_dir, work / "code")
    write_layout(args.data, code / "data")
    fed = FederatedDataset.open(args.data)
    capture = work / "capture"
    shutil.rmtree(capture, ignore_errors=True)
    env = parity_env(
        "fedbcs",
        FEDSEG_PARITY_CAPTURE=str(capture.resolve()),
        FEDSEG_PARITY_SIZE=str(fed.manifest.spatial_shape[0]),
    )
    cmd = [
        "--description", "parity", "--model", "fedbcs", "--arch", args.arch,
        "--dataset", "tnbc", "--source_key", "example",
        "--communication_epoch", str(args.rounds), "--local_epoch", "1",
        "--seed", str(args.seed), "--device_id", "0", *args.extra,
    ]  # fmt: skip
    wall = run_logged([args.python, "main.py", *cmd], code, env, work / "main.out", args.timeout)
    write_round_pick(
        args,
        read_captures(capture, code / "data", args.rounds),
        cfg,
        CODE.provenance("main.py", cmd),
        "its best round on test: the mean over domains of class-1 Dice, first of equals",
        wall,
    )


if __name__ == "__main__":
    main()
