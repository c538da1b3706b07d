"""Class-balanced pixel samples: which labelled pixels enter a pixel-level loss and how much
each one weighs. One implementation for the prototype baselines of FedBCS's comparison
(FPL, FedProto, FedUV, FedPLVM, FedContrast).

A per-class cap (:func:`sample_pixels`) bounds memory but does not balance anything at small
resolutions (at 32 px a batch has far fewer pixels than the cap); the balance comes from the
weights (:func:`pixel_weights`): every class present weighs the same, however many of its
pixels were sampled, so repeating the background pixels of a batch leaves a loss unchanged.
"""

from __future__ import annotations

from typing import Literal

import torch

from fedseg.methods.prototypes import resize_labels

__all__ = ["Balance", "balanced_mean", "pixel_weights", "sample_indices", "sample_pixels"]

Balance = Literal["classes", "pixels"]
"""``classes``: each class present has the same total weight (mean of per-class means);
``pixels``: every sampled pixel the same (background-dominated on most segmentation data)."""


def sample_indices(
    labels: torch.Tensor,
    size: tuple[int, ...],
    num_classes: int,
    cap: int,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(indices [P], classes [P])`` (CPU) of the labelled pixels of ``labels`` ``[B, *S']``
    resized to ``size`` (legacy nearest; ignored pixels match no class), flat over
    ``[B, *size]`` and grouped by class, at most ``cap`` per class, drawn without
    replacement with ``generator`` when a class has more."""
    y = resize_labels(labels, size).flatten().cpu()
    picks = []
    for c in range(num_classes):
        idx = torch.nonzero(y == c).flatten()
        if len(idx) > cap:
            idx = idx[torch.randperm(len(idx), generator=generator)[:cap]]
        picks.append(idx)
    chosen = torch.cat(picks)
    return chosen, y[chosen]


def sample_pixels(
    features: torch.Tensor,
    labels: torch.Tensor,
    num_classes: int,
    cap: int,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(features [P, D], classes [P])`` of the pixels :func:`sample_indices` draws from
    ``features`` ``[B, D, *S]``."""
    chosen, y = sample_indices(labels, tuple(features.shape[2:]), num_classes, cap, generator)
    flat = features.flatten(2)  # [B, D, N]; pixel k of the batch is (k // N, k % N)
    n = flat.shape[2]
    at = chosen.to(features.device)
    return flat[at // n, :, at % n], y.to(features.device)


def pixel_weights(classes: torch.Tensor, balance: Balance = "classes") -> torch.Tensor:
    """Weights ``[N]`` (float32, summing to 1) of rows of the given ``classes``: with
    ``classes`` ``1 / (n_c * C)`` for a row of class c (``n_c`` rows of c, ``C`` classes
    among the rows), with ``pixels`` ``1 / N``."""
    n = len(classes)
    if n == 0:
        return torch.zeros(0, device=classes.device)
    if balance == "pixels":
        return torch.full((n,), 1.0 / n, device=classes.device)
    _, inverse, counts = classes.unique(return_inverse=True, return_counts=True)
    return 1.0 / (counts[inverse].float() * len(counts))


def balanced_mean(
    values: torch.Tensor, classes: torch.Tensor, balance: Balance = "classes"
) -> torch.Tensor:
    """Mean of per-row ``values`` ``[N]`` under :func:`pixel_weights` (0, still connected to
    the graph, when N = 0)."""
    if len(values) == 0:
        return values.sum() * 0.0
    return (values * pixel_weights(classes, balance).to(values)).sum()
