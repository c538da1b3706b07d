"""``data.lazy``: sites read from their folder when used and dropped after, same results."""

import pickle
from pathlib import Path

import pytest
import torch

from fedseg.config import parse_config
from fedseg.data import FederatedDataset
from fedseg.engine.runner import InProcessRunner
from fedseg.engine.sites import LazySiteData, load_sites
from fedseg.testing import synth_folder


@pytest.fixture(scope="module")
def fed_root(tmp_path_factory) -> Path:
    return synth_folder(tmp_path_factory.mktemp("fed") / "faz", "faz", per_site=10)


def test_lazy_site_reads_on_use_drops_on_release_and_pickles_empty(fed_root):
    fed = FederatedDataset.open(fed_root)
    spec, eager = load_sites(fed, "weak")
    spec_lazy, lazy = load_sites(fed, "weak", lazy=True)
    assert spec_lazy == spec
    site = lazy["A"]
    assert isinstance(site, LazySiteData) and site._data is None
    assert site.spec == eager["A"].spec
    assert torch.equal(site.train_labels, eager["A"].train_labels)
    assert site._data is not None  # read on first use
    blob = pickle.dumps(site)
    assert len(blob) < len(pickle.dumps(eager["A"])) / 4  # the tensors do not travel
    site.release()
    assert site._data is None
    again = pickle.loads(blob)
    assert torch.equal(again.scored("val").test_masks, eager["A"].scored("val").test_masks)


def _cfg(root: Path, lazy: bool, workers: int = 1):
    return parse_config(
        {
            "name": "t",
            "seed": 1,
            "data": {"root": str(root), "labels": "weak", "lazy": lazy},
            "method": {"name": "fedbn"},
            "train": {"rounds": 2, "local_iters": 2, "batch_size": 4},
            "engine": {"threads": 1, "workers": workers},
            "eval": {"save_models": False},
        }
    )


def test_lazy_run_equals_in_memory_run(fed_root, tmp_path, monkeypatch):
    held: list[int] = []
    release = LazySiteData.release

    def spy(self):
        release(self)
        held.append(sum(s._data is not None for s in sites.values()))

    sites: dict = {}
    original = load_sites

    def capture(*args, **kwargs):
        spec, out = original(*args, **kwargs)
        sites.update(out)
        return spec, out

    monkeypatch.setattr("fedseg.engine.runner.load_sites", capture)
    monkeypatch.setattr(LazySiteData, "release", spy)
    eager = InProcessRunner(_cfg(fed_root, False), tmp_path / "eager").run()
    sites.clear()
    lazy = InProcessRunner(_cfg(fed_root, True), tmp_path / "lazy").run()
    assert all(isinstance(s, LazySiteData) for s in sites.values())
    assert held and max(held) == 0  # after each step no site holds its tensors
    assert lazy["sites"] == eager["sites"]
