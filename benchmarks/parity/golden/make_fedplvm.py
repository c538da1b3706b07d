"""Golden fixture for FedPLVM's losses and server clustering (tests/fixtures/golden/fedplvm.npz).

Reference: TriStonesWang/FedPLVM @ 867b5f1.

- Losses: ``train_update.criterion_InfoNCE_alpha`` (the alpha-sparsity InfoNCE over all
  global cluster centres) and ``train_update.criterion_correction`` (``2 * MSE(cos(f, class
  mean), 1)``) of ``utils/update.py``, on fixed non-negative (post-ReLU, as its ResNet's
  pooled features) float64 features, for (alpha, tau) = (0.25, 0.07) (its defaults) and
  (1, 0.5); value and gradient with respect to the features. Both functions build their
  ``logits``/``target`` buffers with ``torch.zeros``/``torch.ones`` in the default dtype, so
  they are run with ``torch.set_default_dtype(torch.float64)`` to stay in float64 throughout.
  The ``train_update`` object is made without its ``__init__`` (which builds a DataLoader);
  the two methods read only ``args.tau``, ``args.alpha``, ``args.device`` and
  ``criterion_MSE``, which are set as ``__init__`` sets them.
- Server: ``main.py``'s sequence ``local_cluster_collect`` -> ``cluster_protos_finch`` ->
  ``proto_aggregation_cluster`` (``utils/util.py``) on the local cluster centres that
  ``cluster_protos_finch`` gives for three clients' fixed float32 features.

    python benchmarks/parity/golden/make_fedplvm.py --git-dir FedPLVM/.git
"""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import numpy as np
import torch
from _reference import checkout, load_module, parse_git_dir, write_fixture
from torch import nn

REPO, COMMIT = "TriStonesWang/FedPLVM", "867b5f145909b1aac4b29fdd55f491eac2ec5ad4"
CLASSES, DIM, BATCH = 3, 6, 8
CENTRES = (3, 1, 2)  # global centres per class; class 1's is a 1-D entry as in the code
CASES = ((0.25, 0.07), (1.0, 0.5))
CLIENT_SAMPLES = (14, 9, 20)


def _stack(by_class: dict[int, list[np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    rows = [np.stack(by_class[c]) for c in range(CLASSES) if c in by_class]
    cls = [np.full(len(by_class[c]), c) for c in range(CLASSES) if c in by_class]
    return np.concatenate(rows), np.concatenate(cls).astype(np.int64)


def losses(update: object, rng: np.random.Generator) -> dict[str, np.ndarray]:
    features = np.abs(rng.standard_normal((BATCH, DIM)))
    labels = np.array([0, 1, 2, 0, 1, 2, 0, 0])
    centres = {c: np.abs(rng.standard_normal((k, DIM))) for c, k in enumerate(CENTRES)}
    centres[1] = centres[1][0]  # a class with one centre arrives as a 1-D array
    means = {c: np.atleast_2d(v).mean(0) for c, v in centres.items()}
    out = {"features": features, "labels": labels, "means": np.stack(list(means.values()))}
    rows = {c: list(np.atleast_2d(v)) for c, v in centres.items()}
    out["centres"], out["centre_classes"] = _stack(rows)
    torch.set_default_dtype(torch.float64)
    try:
        for i, (alpha, tau) in enumerate(CASES):
            update.args.alpha, update.args.tau = alpha, tau  # type: ignore[attr-defined]
            for name, fn, protos in (
                ("sparse", update.criterion_InfoNCE_alpha, dict(centres)),  # type: ignore[attr-defined]
                ("correction", update.criterion_correction, dict(means)),  # type: ignore[attr-defined]
            ):
                f = torch.tensor(features, requires_grad=True)
                value = fn(f, torch.tensor(labels), protos)
                value.backward()
                out[f"case{i}.{name}"] = value.detach().numpy()
                out[f"case{i}.{name}.grad"] = f.grad.numpy()
            out[f"case{i}.alpha"], out[f"case{i}.tau"] = np.array(alpha), np.array(tau)
    finally:
        torch.set_default_dtype(torch.float32)
    return out


def server(util: object, rng: np.random.Generator) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    local = {}
    for idx, n in enumerate(CLIENT_SAMPLES):
        feats = np.abs(rng.standard_normal((n, DIM))).astype(np.float32)
        labels = np.arange(n) % CLASSES
        by_class: dict[int, list[np.ndarray]] = {}
        for f, y in zip(feats, labels, strict=True):  # update_weights_proposed's protos_dict
            by_class.setdefault(int(y), []).append(f)
        local[idx], _ = util.cluster_protos_finch(by_class)  # type: ignore[attr-defined]
        out[f"client{idx}.features"], out[f"client{idx}.labels"] = feats, labels
        out[f"client{idx}.local"], out[f"client{idx}.local_classes"] = _stack(local[idx])
    collected = util.local_cluster_collect(local)  # type: ignore[attr-defined]
    glob, _ = util.cluster_protos_finch(collected)  # type: ignore[attr-defined]
    means = util.proto_aggregation_cluster(glob)  # type: ignore[attr-defined]
    out["global"], out["global_classes"] = _stack(glob)
    out["global_means"] = np.stack([means[c] for c in range(CLASSES)])
    return out


def main() -> None:
    git_dir = parse_git_dir(REPO, __doc__.splitlines()[0])
    root = checkout(git_dir, COMMIT, ["utils"])
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*pynndescent.*")
        util = load_module(root, "utils/util.py", "utils.util")
    update_module = load_module(root, "utils/update.py", "utils.update")
    update = object.__new__(update_module.train_update)
    update.args = SimpleNamespace(tau=None, alpha=None, device="cpu")
    update.device = "cpu"
    update.criterion_MSE = nn.MSELoss()

    rng = np.random.default_rng(47)
    arrays = {f"loss.{k}": v for k, v in losses(update, rng).items()}
    arrays |= {f"server.{k}": v for k, v in server(util, rng).items()}
    write_fixture(
        "fedplvm",
        repository=REPO,
        commit=COMMIT,
        function=(
            "utils/update.py: train_update.criterion_InfoNCE_alpha, "
            "train_update.criterion_correction; utils/util.py: local_cluster_collect, "
            "cluster_protos_finch, proto_aggregation_cluster"
        ),
        arrays=arrays,
        notes="loss.*: float64, batch of 8; server.*: float32 features of 3 clients",
    )


if __name__ == "__main__":
    main()
