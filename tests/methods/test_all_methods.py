"""Smoke test: every registered method trains two rounds and evaluates on a toy federation."""

import math

import pytest

from fedseg.engine.simulation import Simulation
from fedseg.methods import TrainSettings, get_method, list_methods
from fedseg.testing import toy_federation

TRAIN = TrainSettings(rounds=2, local_iters=3, batch_size=4, augment=False)


@pytest.mark.parametrize("name", list_methods())
def test_method_runs_two_rounds_and_evaluates(name):
    spec, sites = toy_federation(
        3, with_val=True, labels="full" if name == "centralized" else "weak"
    )
    cls = get_method(name)
    method = cls(cls.Config(), Simulation.method_spec(cls, spec, sites))
    sim = Simulation(method, sites, TRAIN, seed=0)
    for r in range(TRAIN.rounds):
        record = sim.round(r)
        assert all(math.isfinite(v) for m in record["clients"].values() for v in m.values())
    ev = sim.evaluate({"fg": [1]})
    assert set(ev) == set(sites)
    assert all(0.0 <= v["metrics"]["dsc"]["fg"] <= 1.0 for v in ev.values())
    params = sim.params
    assert params["upload"] <= params["download"] <= params["total"]
