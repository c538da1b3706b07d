"""Every method that runs on the virtual-class paper's federation (several sites of unequal
size, RGB images, background + two classes, full masks) makes the optimiser steps of
``local_epochs`` passes over each site's data per round, as the paper's one-epoch protocol
asks of every row of its Table I."""

import math

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from fedseg.engine.simulation import Simulation
from fedseg.errors import ConfigError
from fedseg.methods import TrainSettings, get_method, list_methods
from fedseg.testing import toy_federation

BATCH = 4
SMALL = {  # shrink what only costs time; no option here changes the number of steps
    "fedicra": {"aux_hidden": 8, "ala_max_passes": 2, "ala_window": 1, "body_iters": 1},
    "fedala": {"max_start_passes": 2},
}
PHASES = {"fedrep": 2}
"""Methods whose round is several phases of one round's steps each: FedRep trains its head
for one round's steps, then its body for one round's steps (``schedule: alternating``)."""


def _steps_per_site_and_round(name: str, epochs: int) -> tuple[dict[str, list[int]], dict]:
    spec, data = toy_federation(
        4, n_train=3, size=32, channels=3, num_classes=3, labels="full", with_val=True
    )
    cls = get_method(name)
    cfg = cls.Config(**SMALL.get(name, {}))
    train = TrainSettings(rounds=2, local_epochs=epochs, batch_size=BATCH, augment=False)
    method = cls(cfg, Simulation.method_spec(cls, spec, data))
    sim = Simulation(method, data, train, seed=0)
    counts: dict[str, list[int]] = {}
    current: dict = {}

    def count(opt: torch.optim.Optimizer, *_: object) -> None:
        if current and any(
            id(p) in current["params"] for g in opt.param_groups for p in g["params"]
        ):
            current["n"] += 1

    def client_step(payload, state, ctx):
        current.update(params={id(p) for p in ctx.model.parameters()}, n=0)
        try:
            return step(payload, state, ctx)
        finally:
            counts.setdefault(ctx.site.name, []).append(current["n"])
            current.clear()

    step = method.client_step
    method.client_step = client_step
    handle = register_optimizer_step_post_hook(count)
    try:
        for r in range(train.rounds):
            sim.round(r)
    finally:
        handle.remove()
    return counts, {s: d.spec.num_train for s, d in sim.train_sites.items()}


@pytest.mark.parametrize("name", list_methods())
def test_every_method_makes_local_epochs_passes_per_round(name):
    try:
        counts, sizes = _steps_per_site_and_round(name, epochs=1)
    except ConfigError as err:  # the method does not run on this federation
        pytest.skip(f"{name}: {err}")
    per_pass = {s: math.ceil(n / BATCH) for s, n in sizes.items()}
    assert len(set(per_pass.values())) > 1 or len(per_pass) == 1  # sites differ (CT: pooled)
    phases = PHASES.get(name, 1)
    assert counts == {s: [phases * per_pass[s]] * 2 for s in sizes}, counts
    if name in ("fedlc", "fedvc", "fedavg"):  # two passes double every site's steps
        twice, _ = _steps_per_site_and_round(name, epochs=2)
        assert twice == {s: [2 * phases * per_pass[s]] * 2 for s in sizes}
