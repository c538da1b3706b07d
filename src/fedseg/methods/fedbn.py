"""FedBN (Li et al., ICLR 2021): FedAvg with every BatchNorm layer kept local."""

from __future__ import annotations

from torch import nn

from fedseg.methods.fedavg import FedAvg
from fedseg.methods.partition import Partition, modules_of_type
from fedseg.methods.registry import register_method

__all__ = ["BN_LAYERS", "FedBN"]

BN_LAYERS = modules_of_type(nn.BatchNorm2d, nn.BatchNorm3d)
"""Every key of every BatchNorm layer: weight, bias, running statistics, batch counter."""


@register_method("fedbn")
class FedBN(FedAvg):
    """Sites train as in FedAvg; BN affine parameters and running statistics never leave a
    site, every other weight is averaged by sample count.

    ``wss: dual_decoder`` adds FedLPPA's auxiliary decoder (its BN layers stay local too).

    Reference: Li et al., "FedBN: Federated Learning on Non-IID Features via Local Batch
    Normalization", ICLR 2021.
    """

    partition = Partition(private=(BN_LAYERS,))
    personalized = True
    summary = "FedBN: FedAvg of all non-BN weights; BN parameters and statistics stay local"
