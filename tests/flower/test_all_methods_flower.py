"""Every registered federated method runs two rounds over the Flower engine (through the
in-process transport: the real site handlers, records and validation) and gives exactly the
in-process engine's results."""

from __future__ import annotations

from pathlib import Path

import pytest
from flower_helpers import assert_same_metrics, direct_link, make_config

from fedseg.engine.flower.link import run_federation
from fedseg.engine.runner import InProcessRunner
from fedseg.methods import get_method, list_methods

pytestmark = pytest.mark.flower

FEDERATED = [n for n in list_methods() if not get_method(n).pooled]
AAW = {"fedavg_aaw", "fedprox_aaw"}  # need a validation split


@pytest.mark.parametrize("name", FEDERATED)
def test_method_over_flower_equals_in_process(
    name: str, federation: Path, federation_with_val: Path, tmp_path: Path
):
    root = federation_with_val if name in AAW else federation
    cfg = make_config(root, name)
    cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"local_iters": 3})})
    ref = InProcessRunner(cfg, tmp_path / "inproc").run()
    link, st = direct_link(cfg, root, tmp_path / "flower")
    res = run_federation(cfg, st, link)
    assert_same_metrics(res["sites"], ref["sites"], 0.0)
    assert res["communication"] == ref["communication"]
