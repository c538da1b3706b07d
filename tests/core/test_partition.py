import pytest
from torch import nn

from fedseg.errors import ConfigError
from fedseg.methods import Partition, modules_of_type
from fedseg.models import UNet


@pytest.fixture(scope="module")
def unet() -> UNet:
    return UNet(1, 2)


def test_fedavg_counts_match_paper(unet):
    parts = Partition().resolve(unet)
    assert parts.params() == {"total": 1_813_474, "upload": 1_813_474, "download": 1_813_474}


def test_every_key_in_exactly_one_role(unet):
    parts = Partition(
        private=(modules_of_type(nn.BatchNorm2d),), download_only=("decoder.head.*",)
    ).resolve(unet)
    groups = [set(parts.shared), set(parts.private), set(parts.download_only)]
    keys = set(unet.state_dict())
    assert set().union(*groups) == keys
    assert sum(len(g) for g in groups) == len(keys)
    assert all(".running_mean" not in k for k in parts.shared)
    assert parts.count(parts.upload) == 1_813_474 - 2_944 - 290


def test_bn_selector_finds_bn_without_name_hint(unet):
    keys = modules_of_type(nn.BatchNorm2d)(unet)
    assert keys and not any("bn" in k for k in keys)
    assert (
        Partition(private=(modules_of_type(nn.BatchNorm2d),)).resolve(unet).params()["upload"]
        == 1_810_530
    )


def test_selector_matching_nothing_is_an_error(unet):
    with pytest.raises(
        ConfigError, match=r"partition.private selector '\*.bn\*' matches no model key"
    ):
        Partition(private=("*.bn*",)).resolve(unet)


def test_unassigned_keys_are_an_error(unet):
    with pytest.raises(ConfigError, match="no role"):
        Partition(shared=("encoder.*",)).resolve(unet)
