"""Tiny finished runs (2 sites, 32 px, 1-3 rounds) that the report tests compare."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedseg.cli import app

SETTINGS = [
    "train.local_iters=20",  # enough steps on 32 px for DSC > 0 at some sites
    "train.batch_size=4",
    "train.lr=0.01",
    "train.augment=false",
    "model.widths=[8,16,32]",
    "model.dropout=[0,0,0]",
]


def _run(tmp: Path, name: str, task: str, sets: list[str]) -> Path:
    config = tmp / f"{name}.yaml"
    config.write_text(
        f"name: {name.split('-')[0]}\nseed: 0\n"
        f"data:\n  root: {tmp / task}\n  labels: full\n"
        f"  synth: {{task: {task}, sites: 2, size: 32, per_site: 10}}\n"
        "method: {name: fedavg}\ntrain: {rounds: 2}\n"
    )
    out = tmp / name
    args = ["run", str(config), "--out", str(out)]
    for s in [*SETTINGS, *sets]:
        args += ["--set", s]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    return out


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Polyp runs: ``fedavg`` at seeds 0 and 1, ``prox`` (FedProx) at two ``mu``, ``long``
    (FedAvg, 3 rounds, evaluated every round); and ``fedavg`` on a second task (fundus)."""
    tmp = tmp_path_factory.mktemp("runs")
    return {
        "seed0": _run(tmp, "fedavg-s0", "polyp", []),
        "seed1": _run(tmp, "fedavg-s1", "polyp", ["seed=1"]),
        "mu_small": _run(tmp, "prox-a", "polyp", ["method.name=fedprox", "method.mu=0.01"]),
        "mu_large": _run(tmp, "prox-b", "polyp", ["method.name=fedprox", "method.mu=0.5"]),
        "longer": _run(tmp, "long-r3", "polyp", ["train.rounds=3", "eval.every=1"]),
        "other_task": _run(tmp, "fedavg-f", "fundus", []),
    }
