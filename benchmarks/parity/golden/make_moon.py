"""Golden fixture for MOON's model-contrastive loss (tests/fixtures/golden/moon.npz).

Reference: the contrastive term of ``train_net_fedcon`` in ``main.py`` of QinbinLi/MOON
@ 8fcba3c. The loss is written inline in that training loop, not as a function, so the
generator takes from the function's syntax tree the statements that define it (``criterion``,
``cos``, and the batch loop's ``posi = cos(pro1, pro2)`` through
``loss2 = mu * criterion(logits, labels)``) and runs them unchanged on fixed float64
projections ``pro1`` (local), ``pro2`` (global) and ``pro3`` (the one previous local model,
``model_buffer_size`` 1), with ``.cuda()`` mapped to the CPU (``shims.cpu_cuda``). It records
``loss2`` and its gradient with respect to ``pro1``.

    python benchmarks/parity/golden/make_moon.py --git-dir MOON/.git
"""

from __future__ import annotations

import numpy as np
import torch
from _reference import checkout, parse_git_dir, statements, write_fixture
from shims import cpu_cuda
from torch import nn

REPO, COMMIT = "QinbinLi/MOON", "8fcba3c4efc9a47eb24687a91ba94cfb2005103f"
ROWS, DIM = 10, 6
CASES = ((5.0, 0.5), (1.0, 0.07))  # (mu, temperature): paper's CIFAR-10 value; a sharp tau


class _Previous:
    """Stands for a previous local model: ``net(x)`` returns ``(h, pro3, out)``."""

    def __init__(self, pro3: torch.Tensor) -> None:
        self.pro3 = pro3

    def __call__(self, x: torch.Tensor) -> tuple[None, torch.Tensor, None]:
        return None, self.pro3, None

    def cuda(self) -> _Previous:
        return self

    def to(self, device: str) -> _Previous:
        return self


def main() -> None:
    git_dir = parse_git_dir(REPO, __doc__.splitlines()[0])
    root = checkout(git_dir, COMMIT, ["main.py"])
    source = (root / "main.py").read_text()
    code = "\n".join(
        statements(source, "train_net_fedcon", first, last)
        for first, last in (("criterion", "criterion"), ("cos", "cos"), ("posi", "loss2"))
    )
    print(code)

    torch.manual_seed(47)
    pro1, pro2, pro3 = (torch.randn(ROWS, DIM, dtype=torch.float64) for _ in range(3))
    arrays: dict[str, np.ndarray] = {
        "pro1": pro1.numpy(),
        "pro2": pro2.numpy(),
        "pro3": pro3.numpy(),
    }
    for i, (mu, temperature) in enumerate(CASES):
        z = pro1.clone().requires_grad_(True)
        scope = {
            "torch": torch,
            "nn": nn,
            "pro1": z,
            "pro2": pro2,
            "previous_nets": [_Previous(pro3)],
            "x": torch.zeros(ROWS, 1),
            "mu": mu,
            "temperature": temperature,
        }
        with cpu_cuda():
            exec(compile(code, f"{REPO}@{COMMIT[:7]}:main.py", "exec"), scope)
        loss2 = scope["loss2"]
        loss2.backward()
        arrays |= {
            f"case{i}.mu": np.array(mu),
            f"case{i}.temperature": np.array(temperature),
            f"case{i}.loss2": loss2.detach().numpy(),
            f"case{i}.grad_pro1": z.grad.numpy(),
        }

    write_fixture(
        "moon",
        repository=REPO,
        commit=COMMIT,
        function="main.py: train_net_fedcon, statements criterion, cos, posi ... loss2",
        arrays=arrays,
        notes="float64 projections [10, 6]; one previous model; loss2 = mu * CE(logits / tau, 0)",
    )


if __name__ == "__main__":
    main()
