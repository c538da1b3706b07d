"""Parity driver for llmir/FedLPPA @ 6594e1a: the authors' code on a fedseg federation.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/parity/fedlppa.py --data data/faz-shift0.28125 \
        --strategy FedAvg --seed 0 --rounds 40 --iters 10 --batch 12 --lr 0.01 \
        --out runs/parity/fedlppa/fedavg/seed0 [-- --mu 1e-3 ...]

1. Writes the federation's sites as their ``BaseDataSets`` reads them
   (``Domain{k}/{train,test}/<case id>.h5``; train keys ``image``, ``mask`` and the site's
   weak key, 2 = unlabeled; test keys ``image``, ``mask``), with ``case_map.json``.
2. Runs ``code_v4/flower_pCE_2D_v4_FedLPPA.py`` from an export of the pinned commit (one
   Flower 1.0 server, one client process per site) in its own venv
   (``runs/parity/venv-fedlppa``), with ``shims/fedlppa`` on ``PYTHONPATH``: the CPU shims
   of ``benchmarks/authors_shims`` plus a recorder of each client's test predictions per
   round (README.md). ``--seed`` is their ``--seed`` (they seed random, numpy and torch).
3. Scores the last round's predictions (each client's model as their client evaluates it)
   with fedseg's metrics into ``--out`` and the round their code keeps per client (the
   first best ``val_mean_dice`` on test, ``client_*_best_model.pth``) into
   ``--out/best_round``.
"""

from __future__ import annotations

import re
import shutil
import sys
import time
from pathlib import Path

import h5py
import numpy as np

from fedseg.data import FederatedDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: authors_toy
from authors_toy import (
    AUTHORS_DOMAINS,
    SUP_TYPE,
    _free_port,
    _launch,
    _stop,
    _wait_port,
)
from common import (
    RUNS,
    Code,
    add_predictions,
    arm_config,
    export,
    parity_env,
    parity_parser,
    read_case_map,
    write_case_map,
    write_selections,
)

CODE = Code("llmir/FedLPPA", "6594e1a")
SCRIPT = "code_v4/flower_pCE_2D_v4_FedLPPA.py"
STRATEGIES: dict[str, tuple[str, str, list[str]]] = {
    "FedAvg": ("fedavg", "unet", []),
    "FedProx": ("fedprox", "unet", []),
    "FedBN": ("fedbn", "unet", []),
    "FedRep": ("fedrep", "unet", []),
    "FedALA": ("fedala", "unet", []),
    "FedUniV2.1": (
        "fedlppa",
        "unet_univ5",
        [
            "--alpha",
            "0.1",
            "--beta",
            "0.5",
            "--prompt",
            "universal",
            "--attention",
            "dual",
            "--dual_init",
            "aggregated",
            "--label_prompt",
            "1",
        ],
    ),
}
"""Their ``--strategy`` -> (fedseg method, their ``--model``, their method arguments; FedLPPA's
from their README)."""
CAPTURE = re.compile(r"client(\d+)_iter(\d+)\.npz")


def write_layout(fed_root: Path, dest: Path, labels: str) -> list[str]:
    """Write the federation as their h5 layout at ``dest``; return each site's ``--sup_type``
    (``mask`` for every site with ``labels`` full)."""
    fed = FederatedDataset.open(fed_root)
    if fed.manifest.task != "faz":
        raise SystemExit(f"{fed_root}: task {fed.manifest.task!r}; the driver runs faz")
    sites = fed.manifest.sites
    if len(sites) > AUTHORS_DOMAINS:
        raise SystemExit(f"{fed_root}: {len(sites)} sites; their reader has {AUTHORS_DOMAINS}")
    shutil.rmtree(dest, ignore_errors=True)
    for k in range(AUTHORS_DOMAINS):
        for part in ("train", "test"):
            (dest / f"Domain{k + 1}" / part).mkdir(parents=True)
    ignore, unlabeled = fed.manifest.ignore_index, fed.manifest.num_classes
    sup_types, mapping = [], {}
    for k, site in enumerate(sites):
        weak = labels == "weak" and site.annotation != "full"
        sup = SUP_TYPE[site.annotation] if weak else "mask"
        sup_types.append(sup)
        for part in ("train", "test"):
            split = fed.load(site.name, part, "weak" if weak and part == "train" else "full")
            for i, cid in enumerate(split.ids):
                name = f"Domain{k + 1}/{part}/{cid}.h5"
                mapping[name] = (site.name, cid)
                with h5py.File(dest / name, "w") as h5:
                    h5["image"] = split.images[i, 0].numpy()
                    h5["mask"] = split.masks[i].numpy().astype(np.uint8)
                    if part == "train" and sup != "mask":
                        w = split.labels[i].numpy()
                        h5[sup] = np.where(w == ignore, unlabeled, w).astype(np.uint8)
    write_case_map(dest, mapping)
    return sup_types


def read_captures(
    capture: Path, layout: Path, clients: int, last_iter: int
) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, dict[str, np.ndarray]], dict[str, int]]:
    """Per site, the last round's and their selected round's predictions
    ``{site: {case id: label map}}``, and the selected iteration per site."""
    by_client: dict[int, dict[int, Path]] = {}
    for f in capture.glob("client*_iter*.npz"):
        m = CAPTURE.fullmatch(f.name)
        if m:
            by_client.setdefault(int(m[1]), {})[int(m[2])] = f
    case_map = read_case_map(layout)
    last: dict[str, dict[str, np.ndarray]] = {}
    best: dict[str, dict[str, np.ndarray]] = {}
    chosen: dict[str, int] = {}
    for cid in range(clients):
        rounds = by_client.get(cid, {})
        if last_iter not in rounds:
            raise SystemExit(f"{capture}: client {cid} has no evaluation at iteration {last_iter}")
        score, pick = -np.inf, 0
        for it in sorted(rounds):  # their rule: keep the first strictly better val_mean_dice
            dice = float(np.load(rounds[it])["val_mean_dice"])
            if dice > score:
                score, pick = dice, it
        for target, it in ((last, last_iter), (best, pick)):
            add_predictions(target, rounds[it], case_map)
        chosen[case_map[str(np.load(rounds[pick])["names"][0])][0]] = pick
    return last, best, chosen


def main() -> None:
    ap = parity_parser(__doc__, CODE, "venv-fedlppa", "their script")
    ap.add_argument("--strategy", choices=sorted(STRATEGIES), required=True)
    ap.add_argument("--labels", choices=["weak", "full"], default="weak")
    ap.add_argument("--iters", type=int, default=10, help="local iterations per round")
    ap.add_argument("--batch", type=int, default=12)
    ap.add_argument("--lr", type=float, default=0.01)
    args = ap.parse_args()
    method, model, method_args = STRATEGIES[args.strategy]
    train = {"rounds": args.rounds, "local_iters": args.iters, "batch_size": args.batch}
    cfg = arm_config(
        f"parity-fedlppa-{method}",
        {"name": method},
        args.data,
        labels=args.labels,
        seed=args.seed,
        train={**train, "lr": args.lr},
        like=args.like,
    )
    work = args.work or RUNS / "work" / f"fedlppa-{args.strategy}-s{args.seed}"
    fed = FederatedDataset.open(args.data)
    size = fed.manifest.spatial_shape[0]
    sup_types = write_layout(args.data, work / "h5", args.labels)
    code = export(CODE, args.git_dir, work / "code")
    cwd, capture, logs = work / "cwd", work / "capture", work / "logs"
    for d in (cwd, capture, logs):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    port = _free_port()
    env = parity_env(
        "fedlppa",
        FEDSEG_PARITY_CAPTURE=str(capture),
        MPLBACKEND="Agg",
        GRPC_ENABLE_FORK_SUPPORT="0",
    )
    exp = f"parity/{args.strategy}-s{args.seed}"
    their_args = [
        "--root_path", str((work / "h5").resolve()), "--num_classes", str(fed.manifest.num_classes),
        "--in_chns", str(fed.manifest.channels), "--img_class", "faz", "--exp", exp,
        "--model", model, "--max_iterations", str(args.iters * args.rounds),
        "--iters", str(args.iters), "--eval_iters", str(args.iters),
        "--tsne_iters", str(args.iters * (args.rounds + 1)), "--batch_size", str(args.batch),
        "--base_lr", str(args.lr), "--amp", "0", "--server_address", f"127.0.0.1:{port}",
        "--strategy", args.strategy, "--min_num_clients", str(len(sup_types)),
        "--img_size", str(size), "--seed", str(args.seed), "--gpu", "0",
        *method_args, *args.extra,
    ]  # fmt: skip
    script = [args.python, str(code / SCRIPT), *their_args]
    procs = {}
    t0 = time.perf_counter()
    try:
        procs["server"] = _launch(
            [*script, "--role", "server", "--client", "client_all", "--sup_type", "mask"],
            cwd,
            env,
            logs / "server.out",
        )
        _wait_port(port, procs["server"], 600)
        for k, sup in enumerate(sup_types):
            procs[f"client{k}"] = _launch(
                [*script, "--role", "client", "--cid", str(k), "--client", f"client{k + 1}",
                 "--sup_type", sup],
                cwd, env, logs / f"client{k}.out",
            )  # fmt: skip
        for name, p in procs.items():
            if p.wait(max(1.0, args.timeout - (time.perf_counter() - t0))) != 0:
                raise SystemExit(f"their {name} exited with {p.returncode}; see {logs}")
    finally:
        _stop(procs)
    wall = time.perf_counter() - t0
    last, best, chosen = read_captures(
        capture, work / "h5", len(sup_types), args.rounds * args.iters
    )
    at = their_args.index("--server_address")
    shown = their_args[their_args.index("--model") : at] + their_args[at + 2 :]
    parity = CODE.provenance(SCRIPT, shown, sup_types=sup_types)
    write_selections(
        args.out,
        args.data,
        last,
        best,
        cfg,
        parity,
        rule="their best round on test: per client, the first best val_mean_dice",
        measured={"wall_s": round(wall, 1), "chosen_iter": chosen},
    )
    print(f"{args.out}: {wall:.0f} s ({wall / args.rounds:.1f} s/round); their picks {chosen}")


if __name__ == "__main__":
    main()
