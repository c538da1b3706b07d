import math

import torch

from fedseg.engine.simulation import Simulation
from fedseg.methods import TrainSettings, get_method
from fedseg.methods.balanced import pixel_weights
from fedseg.methods.feduv import uniformity_loss, variance_loss
from fedseg.testing import toy_federation

TRAIN = TrainSettings(rounds=1, local_iters=2, batch_size=4, augment=False)


def test_variance_penalty_is_high_when_class_probabilities_collapse():
    gen = torch.Generator().manual_seed(0)
    collapsed = torch.randn(1, 4, generator=gen).repeat(64, 1)  # every pixel predicts alike
    spread = torch.randn(64, 4, generator=gen) * 5
    identity = 30 * torch.eye(4)  # one confident sample per class: gamma is reached
    gamma = math.sqrt(3) / 4  # population std of a column of the 4 x 4 identity
    assert math.isclose(float(variance_loss(collapsed)), gamma, rel_tol=1e-5)
    assert float(variance_loss(spread)) < 0.5 * gamma
    assert float(variance_loss(identity)) < 1e-6
    # binary segmentation: a confident prediction meets gamma = 1/2 when both classes weigh
    # the same; 60 background to 4 foreground pixels do not, unless weighted by class
    rows = torch.tensor([[10.0, -10.0]] * 60 + [[-10.0, 10.0]] * 4)
    classes = torch.tensor([0] * 60 + [1] * 4)
    assert 0.2 < float(variance_loss(rows)) < 0.3
    assert float(variance_loss(rows, pixel_weights(classes))) < 1e-6
    assert float(variance_loss(torch.randn(1, 2))) == 0.0  # one sample: no std


def test_variance_gradient_spreads_collapsed_predictions():
    gen = torch.Generator().manual_seed(1)
    logits = (torch.zeros(32, 3) + 0.01 * torch.randn(32, 3, generator=gen)).requires_grad_(True)
    opt = torch.optim.SGD([logits], lr=50.0)
    before = torch.softmax(logits, 1).std(0).mean().item()
    for _ in range(20):
        opt.zero_grad()
        variance_loss(logits).backward()
        opt.step()
    assert torch.softmax(logits, 1).std(0).mean().item() > before + 0.1


def test_uniformity_is_lower_for_spread_embeddings():
    gen = torch.Generator().manual_seed(2)
    spread = torch.nn.functional.normalize(torch.randn(128, 8, generator=gen), dim=1)
    centres = torch.randn(2, 8, generator=gen)
    clustered = centres.repeat_interleave(64, 0) + 0.01 * torch.randn(128, 8, generator=gen)
    assert uniformity_loss(spread) < uniformity_loss(clustered)
    # the median bandwidth makes it scale-free
    torch.testing.assert_close(uniformity_loss(10 * spread), uniformity_loss(spread))
    # by hand on three points
    z = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 2.0]])
    d2 = torch.tensor([1.0, 4.0, 5.0])  # median 4; the 3 self-pairs count exp(0) = 1
    torch.testing.assert_close(uniformity_loss(z), 1 / 3 + 2 / 9 * (-d2 / 4.0).exp().sum())
    assert float(uniformity_loss(torch.ones(5, 3))) == 0.0  # no pair apart
    # bf16 features (engine.amp) are scored in float32: pdist has no bf16 kernel
    z16 = spread.to(torch.bfloat16)
    torch.testing.assert_close(uniformity_loss(z16), uniformity_loss(z16.float()))


def test_uniformity_on_two_classes_pulls_class_clusters_apart_into_one_cloud():
    """Two classes (the binary segmentation case, classes weighing the same): lowering the
    uniformity term mixes the classes, i.e. removes the structure a classifier reads."""

    def scatter_ratio(z: torch.Tensor, y: torch.Tensor) -> float:
        means = torch.stack([z[y == c].mean(0) for c in (0, 1)])
        within = sum(float((z[y == c] - means[c]).pow(2).sum(1).mean()) for c in (0, 1))
        return float((means[0] - means[1]).pow(2).sum()) / within

    gen = torch.Generator().manual_seed(4)
    y = torch.cat([torch.zeros(96), torch.ones(32)]).long()
    w = pixel_weights(y)
    centres = 3 * torch.randn(2, 8, generator=gen)
    z = (centres[y] + 0.3 * torch.randn(128, 8, generator=gen)).requires_grad_()
    no_structure = torch.randn(128, 8, generator=gen)
    assert uniformity_loss(no_structure, w) < uniformity_loss(z, w)
    before = scatter_ratio(z.detach(), y)
    opt = torch.optim.SGD([z], lr=100.0)  # the weights sum to 1: small gradients
    for _ in range(50):
        opt.zero_grad()
        uniformity_loss(z, w).backward()
        opt.step()
    assert scatter_ratio(z.detach(), y) < before / 10


def test_local_training_reports_both_regularisers_and_coefficients_scale_them():
    spec, sites = toy_federation(2, labels="full")
    cls = get_method("feduv")

    def run(**cfg) -> dict[str, float]:
        sim = Simulation(cls(cls.Config(**cfg), spec), sites, TRAIN, seed=5)
        return sim.round(0)["clients"]["site0"]

    base, double = run(), run(std_coeff=5.0, unif_coeff=1.0)
    assert base["var"] > 0 and base["unif"] > 0
    # the reported terms are weighted: twice the coefficients, about twice the terms (the
    # second step's model differs slightly)
    off = run(std_coeff=0.0, unif_coeff=0.0)
    assert off["var"] == off["unif"] == 0.0
    assert 1.8 < double["var"] / base["var"] < 2.2
    assert 1.8 < double["unif"] / base["unif"] < 2.2
