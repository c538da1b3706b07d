"""Local DP-SGD through Opacus: per-example gradients equal single-example passes, the same
step distribution as the batch-of-one algorithm over seeds, the accountant cross-checked
against Opacus's, and Opacus's validator behind the refusal of batch-mixing layers."""

from __future__ import annotations

import pytest
import torch
from opacus.accountants import PRVAccountant, RDPAccountant
from scipy.stats import ks_2samp, ttest_ind

from fedseg.engine.sites import client_context
from fedseg.errors import ConfigError
from fedseg.methods.base import TrainSettings
from fedseg.methods.training import segmentation_loss, step_loop, train_steps
from fedseg.models.unet import UNetConfig
from fedseg.privacy import PrivacySettings, sgd_epsilon
from fedseg.privacy.accountant import ORDERS
from fedseg.privacy.local import DPSGD, require_per_example
from fedseg.testing import toy_federation

SPEC, DATA = toy_federation(1, n_train=8, size=8, labels="full")
TRAIN = TrainSettings(optimizer="sgd", lr=1.0, momentum=0.0, weight_decay=0.0, batch_size=4)


def _net(dropout: float) -> torch.nn.Module:
    torch.manual_seed(0)
    return UNetConfig(widths=(8, 16), dropout=(dropout, dropout), norm="group").build(1, 2, 2)


def _ctx(model: torch.nn.Module, seed: int):
    return client_context(
        DATA["site0"],
        SPEC,
        TRAIN,
        round_index=0,
        seed=seed,
        model=model,
        device=torch.device("cpu"),
    )


def _flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def _batch_of_one_step(model, ctx, settings: PrivacySettings) -> None:
    """The reference: each sampled example's gradient from its own forward and backward
    pass, clipped, summed, noised, divided by the batch size; one plain SGD step (lr 1)."""
    sgd = DPSGD(settings, ctx, 0)
    images, labels = sgd.sample()
    loss_fn, params = segmentation_loss(ctx), list(model.parameters())
    summed = [torch.zeros_like(p) for p in params]
    model.train()
    for i in range(len(images)):
        grads = torch.autograd.grad(loss_fn(model(images[i : i + 1]), labels[i : i + 1]), params)
        norm = torch.cat([g.flatten() for g in grads]).double().norm()
        for s, g in zip(summed, grads, strict=True):
            s.add_(g, alpha=min(1.0, settings.clip / float(norm)))
    with torch.no_grad():
        for p, s in zip(params, summed, strict=True):
            noise = torch.randn(s.shape, generator=ctx.generator)
            p -= (s + settings.noise_multiplier * settings.clip * noise) / TRAIN.batch_size


def _opacus_step(model, ctx, settings: PrivacySettings) -> None:
    with step_loop(DPSGD(settings, ctx, 0)):
        train_steps(model, ctx, iters=1)


def test_per_example_gradients_equal_single_example_passes():
    """Without dropout and noise, the Opacus step equals the batch-of-one step value for
    value (the same Poisson sample, clip small enough to bind)."""
    settings = PrivacySettings(mode="local", clip=0.05, noise_multiplier=1e-9)
    a, b = _net(0.0), _net(0.0)
    start = _flat(a)
    _opacus_step(a, _ctx(a, 7), settings)
    _batch_of_one_step(b, _ctx(b, 7), settings)
    moved = _flat(a) - start
    assert float(moved.norm()) > 1e-3
    torch.testing.assert_close(moved, _flat(b) - start, rtol=1e-4, atol=1e-6)


def test_step_distribution_over_seeds_matches_the_batch_of_one_algorithm():
    """With dropout and noise: over 40 independent seeds each, the step's projection on the
    first seed's noise-free direction and its norm have the same distribution (two-sample KS
    and Welch t-tests, p > 0.001) as the batch-of-one algorithm's."""
    settings = PrivacySettings(mode="local", clip=0.05, noise_multiplier=0.3)
    ref = _net(0.3)
    _batch_of_one_step(ref, _ctx(ref, 0), settings.model_copy(update={"noise_multiplier": 1e-9}))
    direction = _flat(ref) - _flat(_net(0.3))
    direction /= direction.norm()

    def steps(step, seeds):
        out = []
        for seed in seeds:
            model = _net(0.3)
            start = _flat(model)
            torch.manual_seed(seed)  # dropout
            step(model, _ctx(model, seed), settings)
            moved = _flat(model) - start
            out.append((float(moved @ direction), float(moved.norm())))
        return torch.tensor(out)

    new, old = steps(_opacus_step, range(40)), steps(_batch_of_one_step, range(40, 80))
    for j in range(2):
        assert ks_2samp(new[:, j], old[:, j]).pvalue > 1e-3
        assert ttest_ind(new[:, j], old[:, j], equal_var=False).pvalue > 1e-3
    assert float(new[:, 0].mean()) > 0  # the signal survives the noise on average


@pytest.mark.parametrize(
    ("z", "rate", "steps", "delta"),
    [(1.1, 0.05, 39, 1e-5), (1.0, 0.36, 200, 1e-3), (0.8, 1.0, 10, 1e-4), (2.0, 0.01, 1000, 1e-5)],
)
def test_accountant_agrees_with_opacus(z, rate, steps, delta):
    """dp-accounting's RDP epsilon equals Opacus's RDP accountant at the same orders (relative
    1e-9); Opacus's PRV accountant (tighter) lies below it, within 25 %."""
    ours = sgd_epsilon(PrivacySettings(mode="local", noise_multiplier=z, delta=delta), rate, steps)
    rdp, prv = RDPAccountant(), PRVAccountant()
    rdp.history = prv.history = [(z, rate, steps)]
    assert rdp.get_epsilon(delta, alphas=list(ORDERS)) == pytest.approx(ours, rel=1e-9)
    assert 0.75 * ours < prv.get_epsilon(delta) <= ours


def test_opacus_validator_refuses_batch_norm_and_accepts_group_norm():
    require_per_example(UNetConfig(widths=(8, 16), dropout=(0, 0), norm="group").build(1, 2, 2))
    with pytest.raises(ConfigError, match=r"BatchNorm layers \(encoder"):
        require_per_example(UNetConfig(widths=(4, 8), dropout=(0, 0)).build(1, 2, 2))
    # a batch-mixing layer Opacus knows, not named BatchNorm by fedseg's own check
    with pytest.raises(ConfigError, match="Opacus refuses the network"):
        require_per_example(torch.nn.Sequential(torch.nn.Conv2d(1, 2, 1), torch.nn.LSTM(2, 2)))


def test_networks_outside_per_example_hooks_refuse():
    """SynergyNet's attention has no Opacus hook (ModuleValidator names the replacement), and
    a module with a loss term of the whole batch's forward is refused even where every layer
    has a hook."""
    from fedseg.models.synergynet import SynergyNetConfig

    net = SynergyNetConfig(widths=(8, 16, 32), dropout=(0, 0, 0), norm="group").build(1, 2, 2)
    with pytest.raises(ConfigError, match=r"Opacus refuses the network: .*MultiheadAttention"):
        require_per_example(net)

    class BatchTerm(torch.nn.Conv2d):
        def pop_auxiliary_loss(self) -> torch.Tensor | None:
            return None

        def auxiliary_metrics(self) -> dict[str, float]:
            return {}

    with pytest.raises(ConfigError, match="BatchTerm adds a loss term of the whole batch"):
        require_per_example(torch.nn.Sequential(BatchTerm(1, 2, 1)))
