"""Golden fixture for FedALA's adaptive local aggregation (tests/fixtures/golden/fedala.npz).

Reference: ``ALA.adaptive_local_aggregation`` in ``system/utils/ALA.py`` of TsingZ0/FedALA
@ a7a9b21, run on a CPU (``device='cpu'``, its own option) with a small float32 MLP and a
cross-entropy loss, ``layer_idx=2`` (the last weight and bias), ``eta=1``, ``rand_percent=100``
(the whole local set, so its random window is fixed), ``threshold=0.1``,
``num_pre_loss=10``. Two calls on one ALA object: the first trains the weights until the
per-pass loss settles, the second one pass, starting from the first call's weights.

    python benchmarks/parity/golden/make_fedala.py --git-dir FedALA/.git
"""

from __future__ import annotations

import contextlib
import io
import re

import numpy as np
import torch
from _reference import checkout, load_module, parse_git_dir, write_fixture
from torch import nn

REPO, COMMIT = "TsingZ0/FedALA", "a7a9b21342859005f22fc0bffbdb1846975de53b"
SAMPLES, BATCH, FEATURES, CLASSES = 12, 4, 4, 3


def model() -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, 6), nn.ReLU(), nn.Linear(6, CLASSES))


def shifted(net: nn.Module, scale: float) -> nn.Module:
    """A copy of ``net`` with seeded noise added to every parameter."""
    out = model()
    out.load_state_dict({k: v + scale * torch.randn_like(v) for k, v in net.state_dict().items()})
    return out


def main() -> None:
    git_dir = parse_git_dir(REPO, __doc__.splitlines()[0])
    root = checkout(git_dir, COMMIT, ["system/utils/ALA.py"])
    ala_module = load_module(root, "system/utils/ALA.py", "fedala_reference_ala")

    torch.manual_seed(47)
    x = torch.randn(SAMPLES, FEATURES)
    y = torch.randint(CLASSES, (SAMPLES,))
    local = model()
    glob = shifted(local, 0.5)
    arrays: dict[str, np.ndarray] = {"x": x.numpy(), "y": y.numpy()}
    ala = ala_module.ALA(
        cid=0,
        loss=nn.CrossEntropyLoss(),
        train_data=list(zip(x, y, strict=True)),
        batch_size=BATCH,
        rand_percent=100,
        layer_idx=2,
        eta=1.0,
        device="cpu",
        threshold=0.1,
        num_pre_loss=10,
    )
    for r in (1, 2):
        if r == 2:  # the site trained, the server sent a new aggregate
            local, glob = shifted(local, 0.1), shifted(glob, 0.3)
        arrays |= {f"r{r}.local.{k}": v.numpy() for k, v in local.state_dict().items()}
        arrays |= {f"r{r}.global.{k}": v.numpy() for k, v in glob.state_dict().items()}
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            ala.adaptive_local_aggregation(glob, local)  # updates ``local`` in place
        passes = re.search(r"ALA epochs: (\d+)", printed.getvalue())
        arrays[f"r{r}.passes"] = np.array(int(passes.group(1)) if passes else 1)
        names = [k for k, _ in local.named_parameters()][-2:]
        arrays |= {f"r{r}.weights.{k}": w.numpy() for k, w in zip(names, ala.weights, strict=True)}
        arrays |= {f"r{r}.out.{k}": v.detach().numpy() for k, v in local.state_dict().items()}

    write_fixture(
        "fedala",
        repository=REPO,
        commit=COMMIT,
        function="system/utils/ALA.py: ALA.adaptive_local_aggregation",
        arrays=arrays,
        notes=(
            "Sequential(Linear(4,6), ReLU, Linear(6,3)) float32, CrossEntropyLoss, batch 4, "
            "layer_idx 2, eta 1, rand_percent 100, threshold 0.1, num_pre_loss 10; "
            "r1 = start phase (passes until settled), r2 = one pass"
        ),
    )


if __name__ == "__main__":
    main()
