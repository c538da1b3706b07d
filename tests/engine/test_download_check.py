"""A download shared by several sites is validated once; every other payload still is."""

from __future__ import annotations

import pytest
import torch

import fedseg.engine.worker as worker_module
from fedseg.engine.simulation import Simulation
from fedseg.errors import UploadError
from fedseg.methods import Payload, TrainSettings, get_method
from fedseg.testing import toy_federation


def _sim() -> Simulation:
    spec, sites = toy_federation(3, size=32)
    cls = get_method("fedavg")
    return Simulation(cls(cls.Config(), spec), sites, TrainSettings(rounds=1, local_iters=1))


def test_shared_download_checked_once_per_object(monkeypatch) -> None:
    calls: list[str] = []
    original = worker_module.validate_payload

    def counting(site, payload, template, **kw):
        calls.append(kw.get("what", "upload"))
        return original(site, payload, template, **kw)

    monkeypatch.setattr(worker_module, "validate_payload", counting)
    sim = _sim()
    assert len({id(p) for p in sim.payloads.values()}) == 1
    sim.round(0)
    assert calls == ["download"]
    sim.evaluate({"fg": [1]})  # a new global payload after the server step: checked once more
    assert calls == ["download", "download"]


def test_a_bad_download_is_still_rejected() -> None:
    sim = _sim()
    good = next(iter(sim.payloads.values()))
    worker = sim.link.workers["site0"]
    worker.train(0, good)
    bad = Payload({k: v.clone() for k, v in good.tensors.items()})
    key = next(k for k, v in bad.tensors.items() if v.is_floating_point())
    bad.tensors[key].view(-1)[0] = float("nan")
    with pytest.raises(UploadError, match="site1"):
        sim.link.workers["site1"].train(0, bad)
    assert torch.isfinite(good.tensors[key]).all()
