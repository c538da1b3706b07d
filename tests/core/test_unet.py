import pytest
import torch

from fedseg.models import UNet


def test_parameter_count_and_head():
    net = UNet(1, 2)
    assert sum(p.numel() for p in net.parameters()) == 1_813_474
    assert sum(p.numel() for p in net.decoder.head.parameters()) == 290


@pytest.mark.parametrize(("ndim", "shape"), [(2, (2, 3, 48, 40)), (3, (1, 1, 16, 32, 24))])
def test_2d_and_3d_share_code_and_keep_shape(ndim, shape):
    net = UNet(shape[1], 3, ndim=ndim).eval()
    out = net.forward_features(torch.randn(shape))
    assert out.logits.shape == (shape[0], 3, *shape[2:])
    assert [f.shape[1] for f in out.encoder] == [16, 32, 64, 128, 256]
    assert [f.shape[1] for f in out.decoder] == [128, 64, 32, 16]
    torch.testing.assert_close(
        net(torch.zeros(shape)), net.forward_features(torch.zeros(shape)).logits
    )


def test_mismatched_lengths_raise():
    with pytest.raises(ValueError, match="same length"):
        UNet(1, 2, channels=(8, 16), dropout_p=(0.1,))
