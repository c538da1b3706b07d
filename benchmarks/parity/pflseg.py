"""Parity driver for jcwang123/PFL-Seg-Trans @ d715417c (FedDP's code) on a fedseg federation.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/parity/pflseg.py --data data/polyp \
        --fl ours_q --seed 0 --rounds 40 --out runs/parity/pflseg/ours_q/seed0

1. Writes the federation's 4 sites, in manifest order, as its ``polyp`` reader takes them:
   ``polyp/Site{k}/{train,test}/{image,mask}/<case id>.npy``; images H x W x 3 float32 at
   255 x fedseg's values (its loader divides by 255: the inputs are fedseg's own), masks 0/1.
   fedseg's validation split is left out. ``case_map.json`` maps the files to fedseg's cases.
2. Generates ``weights/pvt_v2_b0.pth`` (its ImageNet checkpoint cannot be downloaded here)
   from its own ``pvt_v2_b0()`` after ``torch.manual_seed(--seed)``, kept beside the run for
   the fedseg arm to load (``--weights-only`` stops here: the weights depend on the seed
   alone, so the fedseg arms can run before the code's), and runs ``scripts/train_fed.py
   --net pvtb0_fpn --dataset polyp --fl F --max_epoch N --base_lr 1e-3`` from an export of
   the pinned commit in its own venv (``runs/parity/venv-pflseg``) with ``shims/pflseg`` on
   ``PYTHONPATH`` (README.md).
   Its ``Dataset.__len__`` is 300: each round is 300 random draws (with replacement) per
   site (38 batches of 8), whatever the site's size; the fedseg arm must mirror that.
3. Scores the last round's per-site models with fedseg's metrics into ``--out`` and the
   round it keeps (one choice for all sites: the best mean over sites of its test Jaccard,
   its ``Site{k}_best.pth``) into ``--out/best_round``.

``--stage1 RUN`` trains nothing: it scores the rounds' test predictions that the ``ours_q``
run with ``--ft-epochs`` written to ``RUN`` left in ``--work`` (FedDP's stage 1, before
fine-tuning), a stage-1 arm of the same runs; its wall time is that run's minus the
fine-tuning's. ``--fresh-draws`` (a diagnostic, not a parity arm) runs the code without its
replayed draws (shim item 6): each round draws its 300 images anew.
"""

from __future__ import annotations

import argparse
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
    write_selections,
)

from fedseg.data import FederatedDataset
from fedseg.reporting.runs import read_results

CODE = Code("jcwang123/PFL-Seg-Trans", "d715417c")
FL = {"fedavg": "fedavg", "fedrep": "fedrep", "fedbabu": "fedbabu", "ours_q": "feddp"}
"""Its ``--fl`` -> the fedseg method it is compared with (``ours_q``: FedDP before its
fine-tuning step ``train_ft.py``, which this driver does not run)."""
CAPTURE = re.compile(r"site(\d+)_round(\d+)\.npz")
SITES = 4
DRAWS = 300
"""Its ``Dataset.__len__``: an epoch (a round, a fine-tuning epoch) is 300 draws a site."""


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


def _captures(capture: Path, evaluations: int) -> dict[int, dict[int, Path]]:
    """The capture files by evaluation (from 0) and site; every site in every evaluation."""
    files: dict[int, dict[int, Path]] = {}
    for f in capture.glob("site*_round*.npz"):
        if m := CAPTURE.fullmatch(f.name):
            files.setdefault(int(m[2]), {})[int(m[1])] = f
    if sorted(files) != list(range(evaluations)) or any(len(v) != SITES for v in files.values()):
        raise SystemExit(f"{capture}: not every site evaluated {evaluations} times")
    return files


def _preds(files: dict[int, Path], data: Path) -> dict[str, dict[str, np.ndarray]]:
    preds: dict[str, dict[str, np.ndarray]] = {}
    case_map = read_case_map(data)
    for f in files.values():
        add_predictions(preds, f, case_map)
    return preds


def _jaccard(f: Path) -> float:
    return float(np.load(f)["jaccard"])


def read_captures(
    capture: Path, data: Path, rounds: int
) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, dict[str, np.ndarray]], int]:
    """The last round's and its best round's predictions and the best round (0-based;
    its rule: the first round whose mean over sites of mean test Jaccard is highest)."""
    files = _captures(capture, rounds)
    overall = {r: np.mean([_jaccard(f) for f in v.values()]) for r, v in files.items()}
    best, top = 0, 0.0
    for r in sorted(overall):  # `overall_score > best_score`, best_score starting at 0
        if overall[r] > top:
            best, top = r, overall[r]
    return _preds(files[rounds - 1], data), _preds(files[best], data), best


def read_ft_captures(
    capture: Path, data: Path, epochs: int
) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, dict[str, np.ndarray]], list[int]]:
    """``train_ft.py``'s last epoch's predictions, its own per-site picks and the picked
    epochs (0: the starting model, which it scores first; its rule: per site, the first
    epoch whose mean test Jaccard beats every earlier one, the start included)."""
    files = _captures(capture, epochs + 1)
    picks = []
    for k in range(SITES):
        scores = [_jaccard(files[e][k]) for e in range(epochs + 1)]
        best = 0
        for e in range(1, epochs + 1):  # `score > best_score[site_index]`
            if scores[e] > scores[best]:
                best = e
        picks.append(best)
    picked = {k: files[e][k] for k, e in enumerate(picks)}
    return _preds(files[epochs], data), _preds(picked, data), picks


def start_fine_tuning(code: Path, capture: Path, fl: str, seed: int) -> str:
    """Put the last round's models (the shim's ``site{k}_last.pth``) where ``train_ft.py
    --load_weight`` reads them (its ``Site{k}_best.pth``, kept as ``Site{k}_its_best.pth``)
    and return the run name to load."""
    runs = list((code / "logs" / "polyp").glob(f"{fl}_*_pvtb0_fpn_s{seed}"))
    if len(runs) != 1:
        raise SystemExit(f"{code}/logs/polyp: expected one {fl} run of seed {seed}, got {runs}")
    for k in range(SITES):
        best = runs[0] / "model" / f"Site{k + 1}_best.pth"
        best.rename(best.with_name(f"Site{k + 1}_its_best.pth"))
        shutil.copy(capture / f"site{k}_last.pth", best)
    return runs[0].name


def score_stage1(args: argparse.Namespace, work: Path, cfg: dict[str, object]) -> None:
    """Write the stage-1 arm (``--stage1 RUN``) from ``work``'s round captures."""
    run = read_results(args.stage1 / "results.json")
    if run.get("seed") != args.seed or "ft_wall_s" not in run.get("parity", {}):
        raise SystemExit(f"{args.stage1}: not a fine-tuned ours_q run of seed {args.seed}")
    parity = run["parity"]
    kept = ("repository", "commit", "script", "arguments", "initial_weights")
    provenance = {k: parity[k] for k in kept if k in parity} | {"scored_from": str(args.stage1)}
    wall = parity["wall_s"] - parity["ft_wall_s"]
    write_round_pick(
        args,
        read_captures((work / "capture").resolve(), (work / "data").resolve(), args.rounds),
        cfg,
        provenance,
        "its best round on test: the first best mean over sites of its test Jaccard",
        wall,
    )


def main() -> None:
    ap = parity_parser(__doc__, CODE, "venv-pflseg", "train_fed.py")
    ap.add_argument("--fl", choices=sorted(FL), required=True)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--batch", type=int, default=8, help="its --batch_size (default 8)")
    ap.add_argument(
        "--ft-epochs",
        type=int,
        default=0,
        help="ours_q: then FedDP's IGC fine-tuning, train_ft.py --fl ours_q_bd_ft, this many "
        "epochs from the last round's models",
    )
    ap.add_argument("--ft-lr", type=float, default=1e-4, help="its --base_lr for train_ft.py")
    ap.add_argument("--lamb", type=float, default=1.0, help="its --lamb (IGC weight), train_ft.py")
    ap.add_argument(
        "--stage1",
        type=Path,
        metavar="RUN",
        help="ours_q: score the rounds (stage 1) of the fine-tuned run RUN, from --work",
    )
    ap.add_argument(
        "--fresh-draws",
        action="store_true",
        help="diagnostic: new draws every round (the shim keeps the loader's worker)",
    )
    ap.add_argument(
        "--weights-only",
        action="store_true",
        help="write the initial weights (<work>/pvt_v2_b0.pth) for --seed and stop",
    )
    args = ap.parse_args()
    if (args.ft_epochs or args.stage1 is not None) and args.fl != "ours_q":
        raise SystemExit(f"--ft-epochs, --stage1: FedDP's (--fl ours_q), not {args.fl}'s")
    if args.ft_epochs and args.stage1 is not None:
        raise SystemExit("--stage1 scores the rounds before fine-tuning: drop --ft-epochs")
    method: dict[str, object] = {"name": FL[args.fl]}
    if args.fl == "ours_q":
        method["ft_epochs"] = args.ft_epochs
        if args.ft_epochs:
            steps = -(-DRAWS // args.batch)
            method |= {"ft_lr": args.ft_lr, "igc_lambda": args.lamb, "ft_epoch_iters": steps}
    cfg = arm_config(
        f"parity-pflseg-{args.fl}"
        + (f"-ft{args.ft_epochs}" if args.ft_epochs else "")
        + ("-fresh-draws" if args.fresh_draws else ""),
        method,
        args.data,
        labels="full",
        seed=args.seed,
        train={"rounds": args.rounds, "batch_size": args.batch, "lr": args.lr},
        like=args.like,
    )
    work = args.work or RUNS / "work" / f"pflseg-{args.fl}-s{args.seed}"
    if args.stage1 is not None:
        score_stage1(args, work, cfg)
        return
    code = export(CODE, args.git_dir, work / "code")
    data, capture = (work / "data").resolve(), (work / "capture").resolve()
    write_layout(args.data, data)
    shutil.rmtree(capture, ignore_errors=True)
    env = parity_env("pflseg", FEDSEG_PARITY_DATA=str(data), FEDSEG_PARITY_CAPTURE=str(capture))
    if args.ft_epochs:
        env["FEDSEG_PARITY_KEEP_LAST"] = "1"
    if args.fresh_draws:
        env["FEDSEG_PARITY_FRESH_DRAWS"] = "1"
    (code / "weights").mkdir(exist_ok=True)
    weights = (
        f"import torch; torch.manual_seed({args.seed}); from networks.FPN.pvtv2 import pvt_v2_b0; "
        "torch.save(pvt_v2_b0().state_dict(), 'weights/pvt_v2_b0.pth')"
    )
    subprocess.run([args.python, "-c", weights], cwd=code, env=env, check=True)
    shutil.copy(code / "weights" / "pvt_v2_b0.pth", work / "pvt_v2_b0.pth")
    if args.weights_only:
        print(work / "pvt_v2_b0.pth")
        return
    common = ["--net", "pvtb0_fpn", "--dataset", "polyp", "--ver", f"s{args.seed}",
              "--seed", str(args.seed), "--batch_size", str(args.batch), "--gpu", "0"]  # fmt: skip
    cmd = ["--fl", args.fl, "--max_epoch", str(args.rounds), "--base_lr", str(args.lr), *common]
    cmd += args.extra
    argv = [args.python, "scripts/train_fed.py", *cmd]
    wall = run_logged(argv, code, env, work / "train_fed.out", args.timeout)
    initial = str((work / "pvt_v2_b0.pth").resolve())
    provenance = CODE.provenance("scripts/train_fed.py", cmd, initial_weights=initial)
    if args.fresh_draws:
        provenance["diagnostic"] = "fresh draws every round (shim: persistent loader workers)"
    if not args.ft_epochs:
        write_round_pick(
            args,
            read_captures(capture, data, args.rounds),
            cfg,
            provenance,
            "its best round on test: the first best mean over sites of its test Jaccard",
            wall,
        )
        return
    loaded = start_fine_tuning(code, capture, args.fl, args.seed)
    ft_capture = (work / "capture_ft").resolve()
    shutil.rmtree(ft_capture, ignore_errors=True)
    ft_cmd = ["--fl", "ours_q_bd_ft", "--load_weight", loaded, "--lamb", str(args.lamb),
              "--max_epoch", str(args.ft_epochs), "--base_lr", str(args.ft_lr),
              *common]  # fmt: skip
    ft_env = {**env, "FEDSEG_PARITY_CAPTURE": str(ft_capture)}
    ft_wall = run_logged(
        [args.python, "scripts/train_ft.py", *ft_cmd], code, ft_env, work / "train_ft.out",
        args.timeout,
    )  # fmt: skip
    last, picked, epochs = read_ft_captures(ft_capture, data, args.ft_epochs)
    fine_tuning = {
        "script": "scripts/train_ft.py",
        "arguments": ft_cmd,
        "start": "the last round's models (its own: the round it ranks best on test)",
    }
    write_selections(
        args.out,
        args.data,
        last,
        picked,
        cfg,
        {**provenance, "fine_tuning": fine_tuning},
        rule="its best fine-tuning epoch on test, per site (the start included: epoch 0)",
        measured={
            "wall_s": round(wall + ft_wall, 1),
            "ft_wall_s": round(ft_wall, 1),
            "ft_chosen_epochs": epochs,
        },
    )
    print(f"{args.out}: {wall:.0f} s + {ft_wall:.0f} s fine-tuning; its picks: epochs {epochs}")


if __name__ == "__main__":
    main()
