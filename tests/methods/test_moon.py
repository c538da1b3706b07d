import math

import torch
import torch.nn.functional as F

from fedseg.engine.simulation import Simulation
from fedseg.methods import TrainSettings, get_method
from fedseg.methods.moon import ProjectedNet, moon_contrastive
from fedseg.testing import toy_federation

TRAIN = TrainSettings(rounds=2, local_iters=2, batch_size=4, augment=False)


def _sim(**cfg) -> Simulation:
    spec, sites = toy_federation(2, labels="full")
    cls = get_method("moon")
    return Simulation(cls(cls.Config(**cfg), spec), sites, TRAIN, seed=1)


def test_contrastive_term_is_low_near_global_and_far_from_previous():
    gen = torch.Generator().manual_seed(0)
    z_glob, z_prev = torch.randn(2, 64, 8, generator=gen)
    noise = 0.1 * torch.randn(64, 8, generator=gen)
    near_glob = moon_contrastive(z_glob + noise, z_glob, z_prev, 0.5)
    near_prev = moon_contrastive(z_prev + noise, z_glob, z_prev, 0.5)
    assert near_glob < math.log(2) < near_prev
    # identical positive and negative (round 1): log 2 whatever the representation
    same = moon_contrastive(torch.randn(64, 8, generator=gen), z_glob, z_glob, 0.5)
    assert math.isclose(float(same), math.log(2), rel_tol=1e-6)
    # the formula, row by row
    z = z_glob + noise
    pos, neg = F.cosine_similarity(z, z_glob) / 0.5, F.cosine_similarity(z, z_prev) / 0.5
    expected = -(pos.exp() / (pos.exp() + neg.exp())).log().mean()
    torch.testing.assert_close(near_glob, expected)


def test_gradient_pulls_towards_global_and_pushes_from_previous():
    gen = torch.Generator().manual_seed(1)
    z_glob, z_prev = torch.randn(2, 32, 8, generator=gen)
    z = torch.randn(32, 8, generator=gen, requires_grad=True)
    before_g = F.cosine_similarity(z, z_glob).mean().item()
    before_p = F.cosine_similarity(z, z_prev).mean().item()
    opt = torch.optim.SGD([z], lr=16.0)  # the loss is a mean over 32 rows
    for _ in range(20):
        opt.zero_grad()
        moon_contrastive(z, z_glob, z_prev, 0.5).backward()
        opt.step()
    assert F.cosine_similarity(z, z_glob).mean().item() > before_g + 0.1
    assert F.cosine_similarity(z, z_prev).mean().item() < before_p - 0.1


def test_previous_local_model_is_private_and_enters_from_round_two():
    sim = _sim()
    model = sim.model
    assert isinstance(model, ProjectedNet)
    # the projection head travels (it is part of the model), the previous model does not
    assert any(k.startswith("projection.") for k in sim.template)
    assert set(sim.template) == set(model.state_dict())
    first = sim.round(0)
    # round 1: previous = initial = global model, so the term is exactly mu * log 2
    for m in first["clients"].values():
        assert math.isclose(m["con"], 5.0 * math.log(2), rel_tol=1e-5)
    for site, state in sim.states.items():
        prev = state["prev"]
        assert set(prev) == set(model.state_dict())
        glob = sim.payloads[site].tensors
        # the kept model is the site's own trained model, not the average
        assert any(not torch.equal(prev[k], glob[k]) for k in glob)
    second = sim.round(1)
    assert all(
        not math.isclose(m["con"], 5.0 * math.log(2), rel_tol=1e-4)
        for m in second["clients"].values()
    )


def test_image_representation_and_projection_width():
    sim = _sim(representation="image", proj_dim=8)
    head = sim.model.projection
    assert head[-1].out_channels == 8 and head[0].in_channels == 16  # dec1 of the toy UNet
    record = sim.round(0)
    assert all(math.isfinite(m["con"]) for m in record["clients"].values())
    params = sim.params
    assert params["total"] == 1_813_474 + (16 * 16 + 16) + (16 * 8 + 8)
    assert params["upload"] == params["download"] == params["total"]
