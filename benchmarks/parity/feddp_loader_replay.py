"""Does FedDP's training loader draw the same images every round? (PFL-Seg-Trans @ d715417c)

    .venv/bin/python benchmarks/parity/feddp_loader_replay.py

Builds the authors' own ``dataloaders.polyp_dataloader.Dataset`` (from an export of the
pinned commit, run in ``runs/parity/venv-pflseg`` with ``shims/pflseg``) over a tiny layout of
``--images`` training images at one site, wraps it in a ``DataLoader`` with the arguments of
``scripts/train_fed.py``'s ``initial_trainer`` (batch 8, shuffle, one worker, its
``worker_init_fn`` that calls ``random.seed(seed + worker_id)``) and lists the files drawn in
each of ``--epochs`` passes (a pass is a round, or a fine-tuning epoch). Its
``Dataset.__getitem__`` ignores the sampler's index and draws ``random.randint`` from Python's
``random``, which the worker re-seeds at every pass, so the passes are expected to be equal.
Prints one line per pass and a verdict; exits 1 when the passes differ. ``--fresh-draws``
checks the shim of ``pflseg.py --fresh-draws`` instead (workers kept over the passes): the
passes are then expected to differ, and it exits 1 when they do not.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

import numpy as np
from common import RUNS, Code, export, parity_env

CODE = Code("jcwang123/PFL-Seg-Trans", "d715417c")

PASSES = """
import json, random, sys
from torch.utils.data import DataLoader
from dataloaders.polyp_dataloader import Dataset
seed, epochs = int(sys.argv[1]), int(sys.argv[2])
def worker_init_fn(worker_id):  # scripts/train_fed.py, initial_trainer
    random.seed(seed + worker_id)
loader = DataLoader(Dataset(client_idx=0, split="train"), batch_size=8, shuffle=True,
                    num_workers=1, pin_memory=False, worker_init_fn=worker_init_fn)
passes = [[name.split("/")[-1] for b in loader for name in b["name"]] for _ in range(epochs)]
print("PASSES " + json.dumps(passes))
"""
"""Run in the authors' environment: ``pin_memory`` off (a CPU has no pinned memory; it does
not touch which items are drawn)."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--git-dir", type=Path, default=CODE.mirror)
    ap.add_argument("--python", type=Path, default=RUNS / "venv-pflseg" / "bin" / "python")
    ap.add_argument("--images", type=int, default=40, help="training images at the site")
    ap.add_argument("--epochs", type=int, default=3, help="passes over the loader")
    ap.add_argument("--seed", type=int, default=0, help="train_fed.py's --seed")
    ap.add_argument("--fresh-draws", action="store_true", help="with the shim's item 6")
    args = ap.parse_args()
    if not args.python.is_file():
        raise SystemExit(f"{args.python}: no such interpreter (benchmarks/parity/README.md)")
    with tempfile.TemporaryDirectory() as tmp:
        code = export(CODE, args.git_dir, Path(tmp) / "code")
        site = Path(tmp) / "data" / "polyp" / "Site1" / "train"
        for sub in ("image", "mask"):
            (site / sub).mkdir(parents=True)
        for i in range(args.images):
            np.save(site / "image" / f"case{i:03d}.npy", np.zeros((8, 8, 3), np.float32))
            np.save(site / "mask" / f"case{i:03d}.npy", np.zeros((8, 8), bool))
        env = parity_env("pflseg", FEDSEG_PARITY_DATA=str(Path(tmp) / "data"))
        if args.fresh_draws:
            env["FEDSEG_PARITY_FRESH_DRAWS"] = "1"
        out = subprocess.run(
            [str(args.python), "-c", PASSES, str(args.seed), str(args.epochs)],
            cwd=code,
            env=env,
            capture_output=True,
            text=True,
        )
    if out.returncode:
        raise SystemExit(f"the authors' loader failed:\n{out.stderr[-2000:]}")
    line = next(x for x in out.stdout.splitlines() if x.startswith("PASSES "))
    passes = json.loads(line.removeprefix("PASSES "))
    for k, names in enumerate(passes, 1):
        counts = [names.count(n) for n in set(names)]
        print(
            f"pass {k}: {len(names)} draws, {len(counts)} of {args.images} images, each "
            f"{min(counts)}-{max(counts)} times, first 3 {names[:3]}"
        )
    same = all(p == passes[0] for p in passes[1:])
    print(f"every pass draws the same images in the same order: {same}")
    raise SystemExit(0 if same != args.fresh_draws else 1)


if __name__ == "__main__":
    main()
