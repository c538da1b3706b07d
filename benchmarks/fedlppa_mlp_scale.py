"""How far FedLPPA's MLP block has moved the scale of the main decoder's head input.

    python benchmarks/fedlppa_mlp_scale.py RUN_DIR [RUN_DIR ...]

The main decoder's last feature is multiplied channel-wise by the MLP block's output before
the segmentation head; the auxiliary decoder, built from the main decoders (Eq. 9), has no MLP.
For each FedLPPA run (with ``checkpoints/last.pt``) this prints the MLP output on 16 training
images of every site for the run's initial network (rebuilt from its config and seed) and for
the last aggregated model: mean absolute value, minimum and maximum. Nothing is trained.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch import nn

from fedseg.engine.worker import initial_model
from fedseg.inference import RunModels


def mlp_output(model: nn.Module, images: torch.Tensor, site: int) -> torch.Tensor:
    """The MLP block's output ``[B, C]`` for ``images`` of site ``site`` (eval mode)."""
    seen: list[torch.Tensor] = []
    hook = model.mlp.register_forward_hook(lambda mod, inp, out: seen.append(out))
    model.eval()
    model.set_site(site, None)
    with torch.no_grad():
        model(images)
    hook.remove()
    return seen[0].flatten(1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="FedLPPA run directories")
    for run_dir in ap.parse_args().runs:
        run = RunModels(run_dir)
        method = run.method
        tensors = run.server.payloads[run.spec.site_names[0]].tensors
        last = method.build_model()
        last.load_state_dict(
            {k: v for k, v in tensors.items() if not k.startswith("aux_decoder.")}, strict=False
        )
        sites = run.sites
        print(f"## {run_dir}\n\n| model | site | mean abs | min | max |\n|---|---|---|---|---|")
        for name, model in (("initial", initial_model(method, run.cfg.seed)), ("last", last)):
            for site, data in sites.items():
                y = mlp_output(model, data.train_images[:16], data.spec.index)
                print(
                    f"| {name} | {site} | {float(y.abs().mean()):.3f} | {float(y.min()):.3f} "
                    f"| {float(y.max()):.3f} |"
                )
        print()


if __name__ == "__main__":
    main()
