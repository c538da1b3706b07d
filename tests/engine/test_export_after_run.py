"""A run's exported models are the models its final evaluation scored: a fine-tuning method
fine-tunes once per site, not again for the export."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedseg.config import parse_config
from fedseg.export import load_exported
from fedseg.inference import RunModels
from fedseg.methods import fedbabu
from fedseg.metrics import MetricAccumulator
from fedseg.run_cli import train


def _config(root: Path, engine: dict):
    return parse_config(
        {
            "name": "tiny-fedbabu",
            "data": {
                "root": str(root),
                "labels": "full",
                "synth": {"task": "fundus", "sites": 2, "size": 32, "per_site": 10},
            },
            "method": {"name": "fedbabu", "ft_epochs": 1},
            "train": {"rounds": 2, "local_iters": 3, "batch_size": 4, "lr": 0.01},
            "eval": {"batch_size": 4, "every": 0, "save_models": True},
            "engine": {"amp": "off", **engine},
        }
    )


@pytest.mark.parametrize(
    ("engine", "per_site"),
    [
        # in one process the export reuses the evaluation's models: one fine-tuning a site
        ({"workers": 1}, 1),
        # with worker processes the evaluation fine-tunes there (not counted in this process)
        # and the export builds the models again here, from the checkpoint
        ({"workers": 2}, 1),
        # with states on disk the models are not kept (memory stays free): built again
        ({"workers": 1, "site_states": "disk"}, 2),
    ],
)
def test_fine_tuning_runs_once_per_site_and_the_export_scores_what_the_run_scored(
    tmp_path, monkeypatch, engine, per_site
):
    calls: list[int] = []
    real = fedbabu.fine_tune

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(fedbabu, "fine_tune", counted)
    run = tmp_path / "run"
    train(_config(tmp_path / "data", engine), run, quiet=True)
    results = json.loads((run / "results.json").read_text())
    sites = sorted(results["sites"])
    assert len(calls) == per_site * len(sites)
    models = RunModels(run)
    for site in sites:
        data = models.sites[site]
        exported = load_exported(run / "models" / f"{site}.pt")
        acc = MetricAccumulator(models.manifest.regions)
        acc.add(exported.label_maps(data.test_images, batch_size=3), data.test_masks)
        assert acc.aggregate()["dsc"] == pytest.approx(results["sites"][site]["dsc"], abs=1e-12)
