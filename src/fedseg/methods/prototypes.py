"""Per-class prototypes of pixel features, and how they travel.

Prototype methods (FedProto, FPL, FedPLVM, FedBCS, ...) average a feature map over the
pixels of each class. On the wire a set of prototypes is a zero-filled ``[K, D]`` tensor
``<name>`` plus an int64 ``[K]`` count tensor ``<name>.count``: a class a site has not seen
has count 0 and a zero row (never NaN), so a payload's shape does not reveal which classes a
site holds and averaging code needs no special case. Variable-size sets (cluster centres)
travel as ``[M, D]`` with a variable first dimension, declared as ``None`` in the template.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import torch
import torch.nn.functional as F

from fedseg.methods.base import TensorSpec
from fedseg.models.layers import resize_nearest

__all__ = [
    "PrototypeAccumulator",
    "class_onehot",
    "class_sums",
    "prototype_spec",
    "prototype_tensors",
    "read_prototypes",
    "resize_labels",
]


def resize_labels(labels: torch.Tensor, size: tuple[int, ...]) -> torch.Tensor:
    """Labels ``[B, *S]`` resized to ``size`` with PyTorch's legacy ``nearest`` (as the
    FedBCS and FPL code resize masks to a feature map); unchanged when sizes agree."""
    if tuple(labels.shape[1:]) == tuple(size):
        return labels
    return resize_nearest(labels[:, None].float(), size)[:, 0].long()


def class_onehot(
    labels: torch.Tensor,
    size: tuple[int, ...],
    num_classes: int,
    ignore_index: int = 255,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(onehot [B, N, K], counts [K])`` of ``labels`` ``[B, *S']`` resized to ``size``
    (``N`` its pixels): row ``(b, n)`` is pixel n's class; ignored pixels and labels outside
    ``[0, K)`` are zero rows and count nowhere."""
    y = resize_labels(labels, size).flatten(1)
    keep = (y != ignore_index) & (y >= 0) & (y < num_classes)
    onehot = F.one_hot(torch.where(keep, y, 0), num_classes).to(dtype) * keep[..., None]
    return onehot, torch.bincount(y[keep], minlength=num_classes)


def class_sums(
    features: torch.Tensor, labels: torch.Tensor, num_classes: int, ignore_index: int = 255
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-class feature sums ``[K, D]`` and pixel counts ``[K]`` of ``features``
    ``[B, D, *S]`` under ``labels`` ``[B, *S']`` (resized to ``S``); ignored pixels and
    labels outside ``[0, K)`` count nowhere. Sums are in the features' dtype, at least
    float32 (bf16 features are summed in float32)."""
    dtype = torch.promote_types(features.dtype, torch.float32)
    onehot, counts = class_onehot(
        labels.to(features.device), tuple(features.shape[2:]), num_classes, ignore_index, dtype
    )
    with torch.autocast(features.device.type, enabled=False):
        # [B, D, N] @ [B, N, K]: no transposed copy of the (large) feature map
        sums = torch.bmm(features.flatten(2).to(dtype), onehot).sum(0).T
    return sums, counts


class PrototypeAccumulator:
    """Collects class prototypes over batches.

    ``mode="pixel"``: the mean over every pixel of the class seen (FPL, FedProto);
    ``mode="batch_mean"``: the unweighted mean of per-batch class means (FedBCS's
    ``agg_func``). Features are detached.
    """

    def __init__(
        self,
        num_classes: int,
        ignore_index: int = 255,
        mode: Literal["pixel", "batch_mean"] = "pixel",
    ) -> None:
        self.num_classes, self.ignore_index, self.mode = num_classes, ignore_index, mode
        self.sums: torch.Tensor | None = None
        self.counts = torch.zeros(num_classes, dtype=torch.long)

    def add(self, features: torch.Tensor, labels: torch.Tensor) -> None:
        """Add the pixels of ``features`` ``[B, D, *S]`` under ``labels``."""
        self.add_sums(*class_sums(features.detach(), labels, self.num_classes, self.ignore_index))

    def add_sums(self, sums: torch.Tensor, counts: torch.Tensor) -> None:
        """Add one batch given as its class sums ``[K, D]`` and pixel counts ``[K]``."""
        sums, counts = sums.detach().cpu().double(), counts.cpu()
        if self.mode == "batch_mean":
            seen = counts > 0
            sums[seen] /= counts[seen, None]
            counts = seen.long()
        self.sums = sums if self.sums is None else self.sums + sums
        self.counts += counts

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(prototypes [K, D] float32, counts [K] int64)``; unseen classes are zero rows.
        With ``batch_mean`` the counts are the number of batches that held the class."""
        if self.sums is None:
            raise ValueError("PrototypeAccumulator.result() before any add()")
        means = torch.zeros_like(self.sums)
        seen = self.counts > 0
        means[seen] = self.sums[seen] / self.counts[seen, None]
        return means.float(), self.counts.clone()


def prototype_tensors(
    name: str, prototypes: torch.Tensor, counts: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Payload entries of a prototype set: ``name`` ``[K, D]`` and ``name.count`` ``[K]``."""
    return {name: prototypes.detach().float().cpu(), f"{name}.count": counts.long().cpu()}


def read_prototypes(
    tensors: Mapping[str, torch.Tensor], name: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(prototypes, counts)`` of the set ``name`` of a payload."""
    return tensors[name], tensors[f"{name}.count"]


def prototype_spec(name: str, num: int | None, dim: int) -> dict[str, TensorSpec]:
    """Template entries of a prototype set with ``num`` rows (``None``: variable)."""
    return {
        name: TensorSpec((num, dim), torch.float32),
        f"{name}.count": TensorSpec((num,), torch.int64),
    }
