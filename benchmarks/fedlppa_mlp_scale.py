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
import yaml
from torch import nn

from fedseg.config import parse_config
from fedseg.data.federation import FederatedDataset
from fedseg.engine.prepare import prepare_data
from fedseg.engine.server import make_method, spec_from_json
from fedseg.engine.sites import load_sites
from fedseg.engine.worker import initial_model


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
    for run in ap.parse_args().runs:
        cfg = parse_config(yaml.safe_load((run / "config.yaml").read_text()), str(run))
        ck = torch.load(run / "checkpoints" / "last.pt", map_location="cpu", weights_only=False)
        method = make_method(cfg, spec_from_json(ck["spec"]))
        payload = ck["server"]["payloads"][0]
        tensors = payload.tensors if hasattr(payload, "tensors") else payload["tensors"]
        last = method.build_model()
        last.load_state_dict(
            {k: v for k, v in tensors.items() if not k.startswith("aux_decoder.")}, strict=False
        )
        _, sites = load_sites(FederatedDataset.open(prepare_data(cfg)), cfg.data.labels)
        print(f"## {run}\n\n| model | site | mean abs | min | max |\n|---|---|---|---|---|")
        for name, model in (("initial", initial_model(method, cfg.seed)), ("last", last)):
            for site, data in sites.items():
                y = mlp_output(model, data.train_images[:16], data.spec.index)
                print(
                    f"| {name} | {site} | {float(y.abs().mean()):.3f} | {float(y.min()):.3f} "
                    f"| {float(y.max()):.3f} |"
                )
        print()


if __name__ == "__main__":
    main()
