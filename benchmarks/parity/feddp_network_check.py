"""Is fedseg's ``pvtv2_fpn`` FedDP's network? (PFL-Seg-Trans @ d715417c)

    .venv/bin/python benchmarks/parity/feddp_network_check.py

Builds the authors' own ``networks.FPN.model.BuildFPN(1, 'pvtb0', 'fpn')`` (from an export of
the pinned commit, run in ``runs/parity/venv-pflseg`` with ``shims/pflseg``; its random
``weights/pvt_v2_b0.pth`` made as ``pflseg.py`` makes it), runs it in eval mode on a fixed
random batch, and loads its whole state dict (encoder, FPN, head) into fedseg's
``PVTv2FPN(3, 1)`` under fedseg's names. Prints the largest difference of the merged FPN
features (what the head reads) and of the foreground probabilities, computed in the code's
order (the sigmoid at stride 4, then the x4 up-sampling: what ``upsample: probabilities``
does on fedseg's two classes) and in the other (``upsample: logits``); exits 1 when the
features or the code-order probabilities differ by more than ``--tol``.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from common import RUNS, Code, export, parity_env

from fedseg.models.fpn import PVTv2FPN
from fedseg.models.pvtv2 import convert_pvtv2_state_dict

CODE = Code("jcwang123/PFL-Seg-Trans", "d715417c")

FORWARD = """
import sys, torch
from networks.FPN.pvtv2 import pvt_v2_b0
torch.manual_seed(int(sys.argv[2]))
torch.save(pvt_v2_b0().state_dict(), "weights/pvt_v2_b0.pth")
from networks.FPN.model import BuildFPN
net = BuildFPN(1, "pvtb0", "fpn").eval()
x = torch.rand(2, 3, 64, 64)
with torch.no_grad():
    out, feat = net(x, return_out=True)
torch.save({"state": net.state_dict(), "x": x, "out": out, "feat": feat}, sys.argv[1])
"""


def fedseg_state(code_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The code's state dict under fedseg's ``PVTv2FPN`` names."""
    encoder = {k[len("backbone.") :]: v for k, v in code_state.items() if k.startswith("backbone.")}
    state = {f"encoder.{k}": v for k, v in convert_pvtv2_state_dict(encoder).items()}
    for key, value in code_state.items():
        if key.startswith("head.p_head."):
            state[f"decoder.head.{key.rsplit('.', 1)[1]}"] = value
        elif key.startswith("decoder."):
            name = key.replace("decoder.", "decoder.fpn.", 1)
            state[
                re.sub(r"seg_blocks\.(\d+)\.block\.(\d+)\.block\.", r"seg_blocks.\1.\2.", name)
            ] = value
    return state


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--git-dir", type=Path, default=CODE.mirror)
    ap.add_argument("--python", type=Path, default=RUNS / "venv-pflseg" / "bin" / "python")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tol", type=float, default=1e-4, help="largest feature difference")
    args = ap.parse_args()
    if not args.python.is_file():
        raise SystemExit(f"{args.python}: no such interpreter (benchmarks/parity/README.md)")
    with tempfile.TemporaryDirectory() as tmp:
        code = export(CODE, args.git_dir, Path(tmp) / "code")
        (code / "weights").mkdir(exist_ok=True)
        dump = Path(tmp) / "code.pt"
        out = subprocess.run(
            [str(args.python), "-c", FORWARD, str(dump), str(args.seed)],
            cwd=code,
            env=parity_env("pflseg"),
            capture_output=True,
            text=True,
        )
        if out.returncode:
            raise SystemExit(f"the authors' network failed:\n{out.stderr[-2000:]}")
        ref = torch.load(dump)
    net = PVTv2FPN(3, 1, upsample="logits").eval()  # one sigmoid channel, as the code
    net.load_state_dict(fedseg_state(ref["state"]))
    size = ref["x"].shape[2:]
    with torch.no_grad():
        feat = net.forward_features(ref["x"]).features["fpn"]
        head = torch.sigmoid(net.decoder.head(feat))
        code_order = F.interpolate(head, size=size, mode="bilinear", align_corners=False)
        logit_order = torch.sigmoid(net(ref["x"]))
    gap = float((feat - ref["feat"]).abs().max())
    top = float(ref["feat"].abs().max())
    prob_gap = float((code_order - ref["out"]).abs().max())
    other = float((logit_order - ref["out"]).abs().max())
    print(f"parameters: {sum(v.numel() for v in ref['state'].values()):,}, every one loaded")
    print(f"merged FPN features: largest difference {gap:.2e} (largest value {top:.2f})")
    print(f"foreground probabilities, sigmoid then up-sampled: largest difference {prob_gap:.2e}")
    print(f"foreground probabilities, logits up-sampled: largest difference {other:.4f}")
    raise SystemExit(0 if max(gap, prob_gap) <= args.tol else 1)


if __name__ == "__main__":
    main()
