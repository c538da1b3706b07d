"""Golden fixture for FedUV's two regularisers (tests/fixtures/golden/feduv.npz).

Reference: ``UVReg.forward`` in ``algs/feduv.py`` of sonhamin/FedUV @ dd2e3c5 (the authors'
code), on fixed float64 logits ``X`` and features ``pro1`` of 10 samples (an odd number of
pairs, 45, so the median of the squared distances is one middle value), for 2 and 4
classes. The variance term (``std_loss``) and the uniformity term (``unif_loss``) are
recorded separately, each with its gradient, by running the loss with
(``std_coeff``, ``unif_coeff``) = (1, 0) and (0, 1). The logits are small so that every
class's probability std is below ``gamma`` (every hinge active; recorded as ``active``).

    python benchmarks/parity/golden/make_feduv.py --git-dir FedUV/.git
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch
import torch.nn.functional as F
from _reference import checkout, load_module, parse_git_dir, write_fixture

REPO, COMMIT = "sonhamin/FedUV", "dd2e3c59fba20662a4234810f93061f4a4edc1b7"
SAMPLES, DIM = 10, 5
CLASS_COUNTS = (2, 4)


def main() -> None:
    git_dir = parse_git_dir(REPO, __doc__.splitlines()[0])
    root = checkout(git_dir, COMMIT, ["algs/feduv.py"])
    feduv = load_module(root, "algs/feduv.py", "feduv_reference")

    torch.manual_seed(47)
    arrays: dict[str, np.ndarray] = {}
    for c in CLASS_COUNTS:
        logits = 0.3 * torch.randn(SAMPLES, c, dtype=torch.float64)
        features = torch.randn(SAMPLES, DIM, dtype=torch.float64)
        target = F.one_hot(torch.arange(SAMPLES) % c, c).float()
        p = f"c{c}."
        arrays |= {p + "logits": logits.numpy(), p + "features": features.numpy()}
        for term, coeffs in (("std", (1.0, 0.0)), ("unif", (0.0, 1.0))):
            args = SimpleNamespace(std_coeff=coeffs[0], unif_coeff=coeffs[1])
            reg = feduv.UVReg(args, c)
            x = logits.clone().requires_grad_(True)
            z = features.clone().requires_grad_(True)
            loss, _ = reg(x, target, z)
            loss.backward()
            arrays[p + term] = loss.detach().numpy()
            arrays[p + term + ".grad_logits"] = x.grad.numpy()
            arrays[p + term + ".grad_features"] = z.grad.numpy()
            arrays[p + "gamma"] = np.array(reg.batch_gamma)
            arrays[p + "active"] = (reg.soft(logits).std(dim=0) < reg.batch_gamma).numpy()

    write_fixture(
        "feduv",
        repository=REPO,
        commit=COMMIT,
        function="algs/feduv.py: UVReg.forward (std_loss with std_coeff 1, unif_loss with "
        "unif_coeff 1)",
        arrays=arrays,
        notes="float64 logits [10, C] (C = 2, 4) and features [10, 5]",
    )


if __name__ == "__main__":
    main()
