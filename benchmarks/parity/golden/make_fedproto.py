"""Golden fixture for FedProto's prototype aggregation (tests/fixtures/golden/fedproto.npz).

Reference: ``agg_func`` (a client's per-class mean of its samples' features) and
``proto_aggregation`` (the server's unweighted mean over the clients holding a class) in
``lib/utils.py`` of yuetan031/FedProto @ 97e42e2, called as ``exps/federated_main.py`` calls
them, on fixed float32 features of three clients (per-sample rows, collected per class as
``lib/update.py`` does). ``lib/utils.py`` imports its data loaders at the top; those
imports of ``torchvision`` are stubbed (``shims.stub_modules``), no loader is used.

Also the regulariser, written inline in ``LocalUpdate.update_weights_het`` (``lib/update.py``):
its statements from ``loss_mse = nn.MSELoss()`` through the ``if``/``else`` that sets
``loss2`` run unchanged (taken from the syntax tree) on fixed float64 features of one batch
and the global prototypes above without class 3 (its rows keep their own features, so they
add 0); value and gradient with respect to the features are recorded.

    python benchmarks/parity/golden/make_fedproto.py --git-dir FedProto/.git
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import torch
from _reference import checkout, load_module, parse_git_dir, statements, write_fixture
from shims import stub_modules
from torch import nn

REPO, COMMIT = "yuetan031/FedProto", "97e42e2741e1ae2e2fce2465e80f38f6997f8836"
CLASSES, DIM = 4, 6
CLIENT_CLASSES = ((0, 1, 2), (0, 1), (0, 2, 3))  # class 3 at one client only
SAMPLES = (9, 6, 11)
BATCH = 8


def regulariser(root: Path, glob: dict[int, list[torch.Tensor]]) -> dict[str, np.ndarray]:
    code = statements(
        (root / "lib/update.py").read_text(), "update_weights_het", "loss_mse", "loss2"
    )
    features = torch.randn(BATCH, DIM, dtype=torch.float64, requires_grad=True)
    labels = torch.arange(BATCH) % CLASSES
    known = {c: [glob[c][0].double()] for c in range(CLASSES - 1)}  # no prototype of class 3
    scope = {
        "nn": nn,
        "copy": copy,
        "protos": features,
        "labels": labels,
        "global_protos": known,
        "loss1": features.sum() * 0,
    }
    exec(compile(code, f"{REPO}@{COMMIT[:7]}:lib/update.py", "exec"), scope)
    scope["loss2"].backward()
    return {
        "mse.features": features.detach().numpy(),
        "mse.labels": labels.numpy(),
        "mse.loss2": scope["loss2"].detach().numpy(),
        "mse.grad": features.grad.numpy(),
    }


def main() -> None:
    git_dir = parse_git_dir(REPO, __doc__.splitlines()[0])
    root = checkout(git_dir, COMMIT, ["lib"])
    with stub_modules(["torchvision", "torchvision.datasets", "torchvision.transforms"]):
        utils = load_module(root, "lib/utils.py", "utils", search=["lib"])

    torch.manual_seed(47)
    arrays: dict[str, np.ndarray] = {}
    local_protos = {}
    for idx, (held, n) in enumerate(zip(CLIENT_CLASSES, SAMPLES, strict=True)):
        labels = torch.tensor(held)[torch.randint(len(held), (n,))]
        labels[: len(held)] = torch.tensor(held)  # every listed class present
        features = torch.randn(n, DIM)
        protos: dict[int, list[torch.Tensor]] = {}
        for i in range(n):  # lib/update.py: agg_protos_label[label].append(protos[i, :])
            protos.setdefault(int(labels[i]), []).append(features[i, :])
        agg = utils.agg_func(protos)
        local_protos[idx] = agg
        arrays |= {f"client{idx}.features": features.numpy(), f"client{idx}.labels": labels.numpy()}
        arrays[f"client{idx}.local"] = np.stack(
            [agg[c].numpy() if c in agg else np.zeros(DIM, np.float32) for c in range(CLASSES)]
        )
        arrays[f"client{idx}.held"] = np.array([c in agg for c in range(CLASSES)])
    glob = utils.proto_aggregation(local_protos)
    arrays["global"] = np.stack([glob[c][0].numpy() for c in range(CLASSES)])
    arrays |= regulariser(root, glob)

    write_fixture(
        "fedproto",
        repository=REPO,
        commit=COMMIT,
        function="lib/utils.py: agg_func (client), proto_aggregation (server); "
        "lib/update.py: LocalUpdate.update_weights_het, statements loss_mse ... loss2",
        arrays=arrays,
        notes="client<i>.local: agg_func per class (zero rows where not held); global: "
        "proto_aggregation per class; mse.*: the regulariser, global prototypes of classes 0-2",
    )


if __name__ == "__main__":
    main()
