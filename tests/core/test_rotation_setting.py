"""``train.rotation`` reaches the batches a client step trains on."""

from __future__ import annotations

import torch

from fedseg.engine.sites import client_context
from fedseg.methods import TrainSettings
from fedseg.testing import toy_federation


def _batch(rotation: str) -> tuple[torch.Tensor, torch.Tensor]:
    spec, sites = toy_federation(1, labels="full", n_train=8, size=32)
    site = next(iter(sites.values()))
    train = TrainSettings(rounds=1, local_iters=1, batch_size=8, rotation=rotation)
    ctx = client_context(
        site, spec, train, round_index=0, seed=0, model=torch.nn.Identity(),
        device=torch.device("cpu"),
    )  # fmt: skip
    return next(ctx.batches)


def test_paper_rotation_leaves_unlabeled_corners_and_right_angles_do_not() -> None:
    _, y45 = _batch("paper_45")
    _, y90 = _batch("right_angles")
    assert (y45 == 255).any()  # rotated-in corners carry no label
    assert not (y90 == 255).any()
