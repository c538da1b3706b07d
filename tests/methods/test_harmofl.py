import pytest
import torch
from torch import nn

from fedseg.engine.flower.privacy import privacy_rows
from fedseg.engine.simulation import Simulation
from fedseg.errors import ConfigError
from fedseg.methods import FederationSpec, TrainSettings, get_method
from fedseg.methods.harmofl import (
    AmpNorm,
    AmpNormNet,
    low_frequency_mask,
    normalize_amplitude,
    perturbed_step,
)
from fedseg.testing import toy_federation

TRAIN = TrainSettings(rounds=2, local_iters=2, batch_size=4, augment=False)


def _spectrum(x: torch.Tensor) -> torch.Tensor:
    return torch.fft.fft2(x.double())


def test_normalised_amplitude_moves_to_shared_one_and_keeps_phase():
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(1, 2, 32, 32, generator=gen)
    other = 3.0 * torch.rand(5, 2, 32, 32, generator=gen) + 1.0  # another "site": other style
    shared = _spectrum(other).abs().mean(0).float()
    out = normalize_amplitude(x, shared, ratio=0.1)
    before, after = _spectrum(x), _spectrum(out)
    mask = low_frequency_mask((32, 32), 0.1)
    assert int(mask.sum()) == 7 * 7  # |k| <= floor(32 * 0.1) = 3 on both axes
    # inside the window the amplitude is the shared one, outside it is the image's own
    close = {"rtol": 1e-5, "atol": 1e-4}  # the output image is float32
    torch.testing.assert_close(after.abs()[0][:, mask], shared.double()[:, mask], **close)
    torch.testing.assert_close(after.abs()[0][:, ~mask], before.abs()[0][:, ~mask], **close)
    assert (after.abs() - shared).norm() < 0.5 * (before.abs() - shared).norm()
    # every phase is unchanged
    torch.testing.assert_close(after / after.abs(), before / before.abs(), **close)


def test_dc_only_normalisation_sets_each_channel_mean_and_keeps_the_rest():
    gen = torch.Generator().manual_seed(1)
    x = torch.rand(3, 2, 16, 16, generator=gen) + 0.5
    shared = _spectrum(torch.rand(4, 2, 16, 16, generator=gen) * 4).abs().mean(0).float()
    out = normalize_amplitude(x, shared, ratio=0.0)  # HarmoFL's code: L = 0
    means = out.mean((2, 3))
    torch.testing.assert_close(means, (shared[:, 0, 0] / 256).expand(3, 2))
    torch.testing.assert_close(out - out.mean((2, 3), keepdim=True), x - x.mean((2, 3), True))


def test_amp_norm_layer_collects_then_is_fixed():
    gen = torch.Generator().manual_seed(2)
    layer = AmpNorm(1, (8, 8), momentum=0.5).train()
    a, b = torch.rand(2, 1, 8, 8, generator=gen), torch.rand(2, 1, 8, 8, generator=gen) + 1
    assert torch.equal(layer(a), a)  # nothing collected: identity
    layer.collect = True
    layer(a)
    amp_a, amp_b = (_spectrum(t).abs().mean(0).float() for t in (a, b))
    torch.testing.assert_close(layer.running_amp, amp_a)
    layer(b)
    torch.testing.assert_close(layer.running_amp, 0.5 * amp_a + 0.5 * amp_b)
    layer.collect = False
    frozen = layer.running_amp.clone()
    layer(b)
    layer.eval()
    layer.collect = True  # evaluation never updates the spectrum
    layer(a)
    assert torch.equal(layer.running_amp, frozen)
    with pytest.raises(ConfigError, match="image size"):
        layer(torch.rand(1, 1, 16, 16))


def test_perturbed_step_takes_the_gradient_at_the_perturbed_weights():
    gen = torch.Generator().manual_seed(3)
    x, y = torch.randn(16, 4, generator=gen), torch.randn(16, 1, generator=gen)

    def make() -> nn.Linear:
        torch.manual_seed(0)
        return nn.Linear(4, 1)

    def loss(net: nn.Linear, w: torch.Tensor | None = None, b: torch.Tensor | None = None):
        w = net.weight if w is None else w
        b = net.bias if b is None else b
        return ((x @ w.T + b - y) ** 2).mean()

    lr, alpha = 0.1, 0.5
    ref = make()
    w0, b0 = ref.weight.detach().clone(), ref.bias.detach().clone()
    gw, gb = torch.autograd.grad(loss(ref), [ref.weight, ref.bias])
    norm = torch.sqrt(gw.pow(2).sum() + gb.pow(2).sum())
    wp = (w0 + alpha * gw / norm).requires_grad_()
    bp = (b0 + alpha * gb / norm).requires_grad_()
    gpw, gpb = torch.autograd.grad(loss(ref, wp, bp), [wp, bp])

    net = make()
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    value = perturbed_step(opt, lambda: loss(net), alpha)
    assert value == pytest.approx(float(loss(ref).detach()))
    torch.testing.assert_close(net.weight.detach(), w0 - lr * gpw)
    torch.testing.assert_close(net.bias.detach(), b0 - lr * gpb)

    plain = make()
    perturbed_step(torch.optim.SGD(plain.parameters(), lr=lr), lambda: loss(plain), 0.0)
    torch.testing.assert_close(plain.weight.detach(), w0 - lr * gw)
    assert (plain.weight - net.weight).abs().max() > 1e-3  # the perturbation changed the step

    clamped = make()
    opt = torch.optim.SGD(clamped.parameters(), lr=lr)
    perturbed_step(opt, lambda: loss(clamped), alpha, clamp=1e-3)  # train.grad_clamp
    torch.testing.assert_close(clamped.weight.detach(), w0 - lr * gpw.clamp(-1e-3, 1e-3))
    assert gpw.abs().max() > 1e-3  # the clamp acted


def _sim(**cfg) -> Simulation:
    spec, sites = toy_federation(2)
    cls = get_method("harmofl")
    return Simulation(cls(cls.Config(**cfg), spec), sites, TRAIN, seed=4)


def test_shared_spectrum_is_averaged_in_round_one_then_fixed_and_harmonises_sites():
    sim = _sim()
    key = "amp_norm.running_amp"
    assert not sim.payloads["site0"].tensors[key].any()
    record = sim.round(0)
    amp = sim.payloads["site0"].tensors[key]
    assert amp.shape == (1, 32, 32) and amp.abs().sum() > 0
    assert torch.equal(amp, sim.payloads["site1"].tensors[key])
    weights = sim.payloads["site0"].tensors["net.decoder.head.weight"].clone()
    sim.round(1)
    assert torch.equal(sim.payloads["site0"].tensors[key], amp)  # fixed after amp_rounds
    assert not torch.equal(sim.payloads["site0"].tensors["net.decoder.head.weight"], weights)
    # the statistic travels: counted in both directions, listed by the privacy table
    values = sum(t.numel() for t in sim.model.state_dict().values())
    assert record["comm"]["upload"]["site0"]["values"] == values
    assert record["comm"]["download"]["site0"]["values"] == values
    spec = FederationSpec(1, 2, 2, 255, "full", sim.method.spec.sites, (32, 32))
    assert privacy_rows(spec, "harmofl")[0]["buffers"] == key
    # normalised images of both sites now share each image's mean intensity (the DC term)
    model = sim.model
    model.load_state_dict(sim.payloads["site0"].tensors)
    raw = {s: d.train_images for s, d in sim.sites.items()}
    assert abs(float(raw["site0"].mean() - raw["site1"].mean())) > 0.1
    means = {s: model.amp_norm.eval()(x).mean((1, 2, 3)) for s, x in raw.items()}
    torch.testing.assert_close(means["site0"], torch.full_like(means["site0"], amp[0, 0, 0] / 1024))
    torch.testing.assert_close(means["site1"], torch.full_like(means["site1"], amp[0, 0, 0] / 1024))


def test_spectrum_keeps_moving_while_amp_rounds_last():
    sim = _sim(amp_rounds=2)
    sim.round(0)
    amp = sim.payloads["site0"].tensors["amp_norm.running_amp"].clone()
    sim.round(1)
    assert not torch.equal(sim.payloads["site0"].tensors["amp_norm.running_amp"], amp)


def test_without_amp_norm_the_network_is_the_plain_one_and_image_size_is_required():
    assert not isinstance(_sim(amp_norm=False).model, AmpNormNet)
    spec, _ = toy_federation(2)
    cls = get_method("harmofl")
    bare = FederationSpec(1, 2, 2, 255, "weak", spec.sites)
    with pytest.raises(ConfigError, match="amp_norm"):
        cls(cls.Config(), bare).build_model()
