"""FSR (FedBCS Sec. 3.2): recalibrates style (Fourier amplitude, channel mean/std) and keeps
content (Fourier phase), and is trainable end to end."""

import pytest
import torch

from fedseg.models.fsr import FSR


def _weights(fsr: FSR, norm: float) -> FSR:
    """Set the learned gate to (lambda_norm, lambda_org) = (norm, 1 - norm)."""
    with torch.no_grad():
        p = torch.tensor([norm, 1 - norm]).clamp(1e-12, 1)
        fsr.logits.copy_(fsr.temperature * p.log())
    return fsr


def _styled(x: torch.Tensor, seed: int) -> torch.Tensor:
    """``x`` with a per-channel contrast and brightness (a 'scanner style')."""
    g = torch.Generator().manual_seed(seed)
    a = 0.5 + 2 * torch.rand(1, x.shape[1], 1, 1, generator=g)
    b = 3 * torch.randn(1, x.shape[1], 1, 1, generator=g)
    return a * x + b


def _stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x.mean((2, 3)), x.std((2, 3))


def _content(x: torch.Tensor) -> torch.Tensor:
    """Fourier phase without the DC term."""
    return torch.fft.rfft2(x).angle().flatten(2)[..., 1:]


def test_original_amplitude_only_is_the_identity():
    x = torch.randn(2, 4, 16, 16)
    torch.testing.assert_close(_weights(FSR(4), 0.0)(x), x, atol=1e-5, rtol=0)


def test_normalised_amplitude_removes_style_and_keeps_phase():
    torch.manual_seed(0)
    x = torch.randn(2, 4, 16, 16)
    fsr = _weights(FSR(4), 1.0)
    with torch.no_grad():
        out, out_styled = fsr(x), fsr(_styled(x, 1))
    # two "scanners" give the same recalibrated map: the affine style is gone
    torch.testing.assert_close(out, out_styled, atol=1e-4, rtol=0)
    mean, std = _stats(out)
    torch.testing.assert_close(mean, torch.zeros_like(mean), atol=1e-5, rtol=0)
    torch.testing.assert_close(std, torch.ones_like(std), atol=0.05, rtol=0)
    # content: the phase of every non-DC frequency is the input's
    torch.testing.assert_close(_content(out), _content(x), atol=1e-3, rtol=0)


def test_default_mix_shrinks_the_style_gap_between_sites():
    torch.manual_seed(1)
    content = torch.randn(2, 4, 16, 16)
    a, b = _styled(content, 2), _styled(content, 3)
    fsr = FSR(4)  # the code's start: 0.5 / 0.5
    with torch.no_grad():
        fa, fb = fsr(a), fsr(b)
    gap_in = [(s - t).abs().mean() for s, t in zip(_stats(a), _stats(b), strict=True)]
    gap_out = [(s - t).abs().mean() for s, t in zip(_stats(fa), _stats(fb), strict=True)]
    assert gap_out[0] < 0.6 * gap_in[0] and gap_out[1] < 0.6 * gap_in[1]
    torch.testing.assert_close(_content(fa), _content(a), atol=1e-3, rtol=0)
    # structure stays: every output channel is perfectly correlated with its input channel
    centred = [t.flatten(2) - t.flatten(2).mean(2, keepdim=True) for t in (fa, a)]
    corr = torch.nn.functional.cosine_similarity(*centred, dim=2)
    assert corr.min() > 0.999


def test_fsr_is_differentiable():
    fsr = FSR(3).double()
    x = torch.randn(2, 3, 8, 8, dtype=torch.double, requires_grad=True)
    assert torch.autograd.gradcheck(fsr, (x,), atol=1e-6)
    fsr(x).pow(2).mean().backward()
    for name, p in fsr.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


def test_training_the_gate_moves_it_towards_the_normalised_style():
    torch.manual_seed(2)
    fsr = FSR(4)
    opt = torch.optim.SGD(fsr.parameters(), lr=0.05)
    x = _styled(torch.randn(4, 4, 16, 16), 4)
    for _ in range(20):  # ask for zero-mean, unit-variance channels
        mean, std = _stats(fsr(x))
        loss = mean.pow(2).mean() + (std - 1).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert torch.softmax(fsr.logits / fsr.temperature, 0)[0] > 0.6


def test_paper_gate_from_pooled_amplitudes_and_3d_maps():
    fsr = FSR(4, gate="gap")
    x = torch.randn(2, 4, 6, 8, 8)
    amp = torch.fft.rfftn(x, dim=(2, 3, 4)).abs()
    w = fsr.style_weights(amp, amp, tuple(x.shape[2:]))
    assert w.shape == (2, 2) and ((w > 0) & (w < 1)).all()
    out = fsr(x)
    assert out.shape == x.shape
    out.sum().backward()
    assert fsr.gate_fc.weight.grad is not None and fsr.gate_fc.weight.grad.abs().sum() > 0


def test_bad_settings():
    with pytest.raises(ValueError, match="gate"):
        FSR(4, gate="sigmoid")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="temperature"):
        FSR(4, temperature=0)


@pytest.mark.parametrize("autocast", [False, True])
def test_bfloat16_maps_are_recalibrated_in_float32(autocast):
    """torch's FFTs take no bfloat16: FSR computes in float32 under bf16 autocast (a conv's
    output) and for bf16 input, and matches the float32 result."""
    fsr = FSR(3)
    x = _styled(torch.randn(2, 3, 16, 16), 0)
    ref = fsr(x)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = fsr(x.bfloat16())
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, atol=0.1, rtol=0.05)
