import math

import pytest
import torch

from fedseg.engine.simulation import Simulation
from fedseg.methods import Payload, TrainSettings, get_method
from fedseg.methods.alignment import class_members
from fedseg.methods.fpl import cluster_prototypes, fpl_losses, unbiased_prototypes
from fedseg.methods.prototypes import prototype_tensors
from fedseg.testing import toy_federation

pytestmark = pytest.mark.filterwarnings("ignore:.*pynndescent.*")

TRAIN = TrainSettings(rounds=2, local_iters=2, batch_size=4, augment=False)
DIM = 16  # dec1 of the toy UNet


def _sim(num_sites: int, **cfg) -> Simulation:
    spec, sites = toy_federation(num_sites, labels="full")
    cls = get_method("fpl")
    return Simulation(cls(cls.Config(**cfg), spec), sites, TRAIN, seed=4)


def _groups() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Class-1 prototypes of 6 sites: 4 near a, 2 near b; b is far from a."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(DIM, generator=gen)
    b = -a + 0.5 * torch.randn(DIM, generator=gen)
    rows = torch.cat(
        [
            a + 0.01 * torch.randn(4, DIM, generator=gen),
            b + 0.01 * torch.randn(2, DIM, generator=gen),
        ]
    )
    return rows, rows[:4].mean(0), rows[4:].mean(0)


def _uploads(rows: torch.Tensor) -> dict[str, Payload]:
    """Site i holds class 1 (prototype rows[i]); only site 0 holds class 0 (all ones)."""
    out = {}
    for i, row in enumerate(rows):
        protos = torch.stack([torch.ones(DIM), row])
        counts = torch.tensor([10 if i == 0 else 0, 20])
        if i:
            protos[0] = 0
        out[f"site{i}"] = Payload(prototype_tensors("protos", protos, counts), num_examples=1)
    return out


def test_server_clusters_site_prototypes_with_finch():
    rows, mean_a, mean_b = _groups()
    members = class_members(_uploads(rows), "protos", 2)
    assert len(members[0][0]) == 1 and len(members[1][0]) == 6
    centres, sizes, classes = cluster_prototypes(members)
    # class 0: one site's prototype kept as is; class 1: two clusters, unweighted means
    assert classes.tolist() == [0, 1, 1]
    torch.testing.assert_close(centres[0], torch.ones(DIM))
    assert sorted(sizes[1:].tolist()) == [2, 4] and sizes[0] == 1
    got = {int(s): c for s, c in zip(sizes[1:], centres[1:], strict=True)}
    torch.testing.assert_close(got[4], mean_a)
    torch.testing.assert_close(got[2], mean_b)


def test_unbiased_prototype_is_the_mean_of_cluster_centres():
    rows, mean_a, mean_b = _groups()
    centres, _, classes = cluster_prototypes(class_members(_uploads(rows), "protos", 2))
    unbiased, per_class = unbiased_prototypes(centres, classes, 3)
    assert per_class.tolist() == [1, 2, 0]
    torch.testing.assert_close(unbiased[1], (mean_a + mean_b) / 2)  # not (4a + 2b) / 6
    assert not torch.allclose(unbiased[1], rows.mean(0), atol=1e-2)
    assert torch.equal(unbiased[2], torch.zeros(DIM))


def test_contrast_and_consistency_pull_features_to_their_class():
    gen = torch.Generator().manual_seed(3)
    centres = torch.randn(3, DIM, generator=gen)
    centre_class = torch.tensor([0, 1, 1])
    near_own = centres[1:2] + 0.05 * torch.randn(1, DIM, generator=gen)
    near_other = centres[0:1] + 0.05 * torch.randn(1, DIM, generator=gen)
    y = torch.tensor([1])
    xi_own, cu_own = fpl_losses(near_own, y, centres, centre_class, 2, 0.02)
    xi_other, _ = fpl_losses(near_other, y, centres, centre_class, 2, 0.02)
    assert xi_own < 0.1 < xi_other
    # L_xi by hand; L_cu against the mean of the class's two centres
    sims = torch.nn.functional.cosine_similarity(near_own, centres) / 0.02
    expected = -torch.log(sims[1:].exp().sum() / sims.exp().sum())
    torch.testing.assert_close(xi_own, expected)
    torch.testing.assert_close(cu_own, (near_own[0] - centres[1:].mean(0)).pow(2).mean())
    # a pixel whose class has no centre adds 0 but counts in the mean (FPL's 1/B)
    f = torch.cat([near_own, torch.randn(1, DIM, generator=gen)])
    xi2, cu2 = fpl_losses(f, torch.tensor([1, 2]), centres, centre_class, 3, 0.02)
    torch.testing.assert_close(xi2, xi_own / 2)
    torch.testing.assert_close(cu2, cu_own / 2)
    # gradient steps move a feature from the other class's centre towards its own
    z = near_other.clone().requires_grad_(True)
    opt = torch.optim.SGD([z], lr=0.05)
    for _ in range(50):
        opt.zero_grad()
        sum(fpl_losses(z, y, centres, centre_class, 2, 0.02)).backward()
        opt.step()
    cos = torch.nn.functional.cosine_similarity(z.detach(), centres)
    assert cos[1:].max() > cos[0]


def test_no_centres_gives_zero_losses_with_a_graph():
    f = torch.randn(4, DIM, requires_grad=True)
    xi, cu = fpl_losses(
        f,
        torch.zeros(4, dtype=torch.long),
        torch.zeros(0, DIM),
        torch.zeros(0, dtype=torch.long),
        2,
        0.02,
    )
    assert xi.item() == cu.item() == 0.0
    (xi + cu).backward()


def test_federation_sends_cluster_centres_and_counts_them():
    sim = _sim(4)
    first = sim.round(0)
    assert all(m["l_xi"] == 0.0 and m["prototypes"] == 2.0 for m in first["clients"].values())
    glob = sim.payloads["site0"].tensors
    m = len(glob["centres"])
    assert (
        first["server"]["centres_per_class"]
        == torch.bincount(glob["centres.class"], minlength=2).tolist()
    )
    assert 2 <= m <= 4 and int(glob["centres.count"].sum()) == 8  # 4 sites x 2 classes
    n_weights = sum(v.numel() for v in sim.model.state_dict().values())
    second = sim.round(1)
    for site, up in second["comm"]["upload"].items():
        assert up["values"] == n_weights + 2 * DIM + 2
        assert second["comm"]["download"][site]["values"] == n_weights + m * DIM + 2 * m
    assert all(m["l_xi"] > 0 and math.isfinite(m["l_cu"]) for m in second["clients"].values())
