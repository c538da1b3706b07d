"""Peak memory and checkpoint size of an in-process run against the number of sites.

Usage: python benchmarks/memory_vs_sites.py [--plan 10:64:10 100:64:10 1000:32:5]
       [--methods fedavg fedbn fedlppa] [--widths 4,8,16,32,64] [--lazy]
       [--site-states memory|disk] [--work /tmp/fedseg-memory]

Each plan entry is ``sites:size:per_site``: a synthetic ``faz`` federation of that many sites
(``fedseg data synth``), trained one round (one local step, batch 2, default UNet or
``--widths``) and evaluated, each (method, sites) in a fresh process. Printed per run: peak
resident memory of that process (``ru_maxrss``), its memory after importing fedseg (the
baseline), the checkpoint size, the size of the site state files (``--site-states disk``),
the size of one model, and wall and CPU seconds. The ratio checkpoint / model shows what the
checkpoint holds beyond one shared model.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

METHODS = ("fedavg", "fedbn", "fedlppa")


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def one(
    method: str, root: Path, out: Path, widths: str, lazy: bool, states: str
) -> dict[str, float]:
    """Run ``method`` one round on the federation at ``root`` (UNet ``widths``, comma-separated;
    empty: the default; ``lazy``: ``data.lazy``; ``states``: ``engine.site_states``);
    measurements of this process."""
    import torch

    from fedseg.config import RunConfig
    from fedseg.engine.rundir import RunDir
    from fedseg.engine.runner import InProcessRunner
    from fedseg.engine.server import make_method, spec_from_json
    from fedseg.engine.worker import initial_model

    torch.set_num_threads(1)
    base = _rss_mib()
    cfg = RunConfig.model_validate(
        {
            "name": f"memory-{method}",
            "data": {"root": str(root), "labels": "weak", "lazy": lazy},
            "method": {"name": method},
            "model": {
                "name": "unet",
                **({"widths": [int(w) for w in widths.split(",")]} if widths else {}),
            },
            "train": {"rounds": 1, "local_iters": 1, "batch_size": 2},
            "eval": {"batch_size": 8},
            "engine": {"device": "cpu", "threads": 1, "site_states": states},
        }
    )
    t0, c0 = time.perf_counter(), time.process_time()
    InProcessRunner(cfg, out).run()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    ck = RunDir(out).checkpoint

    spec = spec_from_json(torch.load(ck, map_location="cpu", weights_only=True)["spec"])
    model = initial_model(make_method(cfg, spec), cfg.seed)
    model_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    return {
        "base_mib": base,
        "peak_mib": _rss_mib(),
        "checkpoint_mib": ck.stat().st_size / 2**20,
        "site_files_mib": sum(f.stat().st_size for f in out.glob("sites/**/*.pt")) / 2**20,
        "model_mib": model_bytes / 2**20,
        "wall_s": wall,
        "cpu_s": cpu,
    }


def synth(root: Path, sites: int, size: int, per_site: int) -> None:
    if (root / "manifest.json").exists():
        return
    exe = Path(sys.executable).with_name("fedseg")
    cmd = [str(exe), "data", "synth", "--task", "faz", "--out", str(root)]
    cmd += ["--sites", str(sites), "--size", str(size), "--per-site", str(per_site)]
    subprocess.run(cmd, check=True, capture_output=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", nargs="+", default=["10:64:10", "100:64:10", "1000:32:5"])
    ap.add_argument("--methods", nargs="+", default=list(METHODS))
    ap.add_argument("--work", type=Path, default=Path("/tmp/fedseg-memory"))
    ap.add_argument("--widths", default="", help="UNet widths, e.g. 4,8,16,32,64 (default UNet)")
    ap.add_argument("--lazy", action="store_true", help="data.lazy: one site in memory")
    ap.add_argument(
        "--site-states", choices=["memory", "disk"], default="memory",
        help="engine.site_states: private states in memory or on disk",
    )  # fmt: skip
    ap.add_argument("--one", nargs=6, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        method, root, out, widths, lazy, states = args.one
        print(json.dumps(one(method, Path(root), Path(out), widths, lazy == "lazy", states)))
        return
    print(
        "| method | sites | px | imgs/site | data | states | peak MiB | base MiB | ckpt MiB "
        "| site files MiB | model MiB | ckpt/model | wall s | CPU s |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    mode = "lazy" if args.lazy else "memory"
    for entry in args.plan:
        sites, size, per_site = (int(v) for v in entry.split(":"))
        root = args.work / f"faz-{sites}-{size}-{per_site}"
        synth(root, sites, size, per_site)
        for method in args.methods:
            out = args.work / f"run-{method}-{sites}-{size}"
            subprocess.run(["rm", "-rf", str(out)], check=True)
            proc = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--one",
                    method,
                    str(root),
                    str(out),
                    args.widths,
                    mode,
                    args.site_states,
                ],
                capture_output=True,
                text=True,
            )
            if proc.returncode:
                print(f"| {method} | {sites} | failed: {proc.stderr.strip().splitlines()[-1]} |")
                continue
            m = json.loads(proc.stdout.strip().splitlines()[-1])
            print(
                f"| {method} | {sites} | {size} | {per_site} | {mode} | {args.site_states} "
                f"| {m['peak_mib']:.0f} "
                f"| {m['base_mib']:.0f} | {m['checkpoint_mib']:.1f} "
                f"| {m['site_files_mib']:.1f} | {m['model_mib']:.1f} "
                f"| {m['checkpoint_mib'] / m['model_mib']:.2f} | {m['wall_s']:.1f} "
                f"| {m['cpu_s']:.1f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
