"""Golden fixture for FedDG-GA's aggregation-weight update (tests/fixtures/golden/feddg_ga.npz),
the lineage of AAW's rule.

Reference: ``refine_weight_dict_by_GA`` in ``utils/weight_adjust.py`` of
MediaBrain-SJTU/FedDG-GA @ 8d03a24, float64, on fixed per-site metrics of four sites:

- ``case0``: ``fair_metric='loss'``, uniform weights (the code's start), ``step_size`` 0.2
  (the code's default ``d``);
- ``case1``: ``fair_metric='acc'`` (the code's default), sample-proportion weights;
- ``case2``: a large step, so that weights clip at 0 and 1 before the renormalisation;
- ``seq``: five consecutive updates with the step schedule of
  ``algorithms/fedavg/train_pacs_GA.py`` (``step_size - (i - 1) * step_size / comm``,
  round ``i`` from 0, ``comm`` 5), each from the previous update's weights.

    python benchmarks/parity/golden/make_feddg_ga.py --git-dir FedDG-GA/.git
"""

from __future__ import annotations

import numpy as np
from _reference import checkout, load_module, parse_git_dir, write_fixture

REPO, COMMIT = "MediaBrain-SJTU/FedDG-GA", "8d03a24a2af2155dc0b8978afacfdb659146bf62"
SITES = ("a", "b", "c", "d")
COMM = 5


def run(
    ref: object, weights: np.ndarray, before: np.ndarray, after: np.ndarray, step: float, fair: str
) -> np.ndarray:
    w = dict(zip(SITES, weights.tolist(), strict=True))
    b = {s: {fair: float(v)} for s, v in zip(SITES, before, strict=True)}
    a = {s: {fair: float(v)} for s, v in zip(SITES, after, strict=True)}
    out = ref.refine_weight_dict_by_GA(w, b, a, step_size=step, fair_metric=fair)  # type: ignore[attr-defined]
    return np.array([out[s] for s in SITES], dtype=np.float64)


def main() -> None:
    git_dir = parse_git_dir(REPO, __doc__.splitlines()[0])
    root = checkout(git_dir, COMMIT, ["utils/weight_adjust.py"])
    ref = load_module(root, "utils/weight_adjust.py", "feddg_ga_weight_adjust")

    rng = np.random.default_rng(47)
    uniform = np.full(len(SITES), 1 / len(SITES))
    samples = np.array([30.0, 10.0, 45.0, 15.0]) / 100
    cases = {
        "case0": (uniform, rng.uniform(0.2, 0.6, 4), rng.uniform(0.3, 0.9, 4), 0.2, "loss"),
        "case1": (samples, rng.uniform(0.6, 0.9, 4), rng.uniform(0.5, 0.9, 4), 0.2, "acc"),
        "case2": (samples, rng.uniform(0.2, 0.6, 4), rng.uniform(0.3, 0.9, 4), 2.4, "loss"),
    }
    arrays: dict[str, np.ndarray] = {}
    for name, (w, before, after, step, fair) in cases.items():
        arrays |= {
            f"{name}.weights": w,
            f"{name}.before": before,
            f"{name}.after": after,
            f"{name}.step": np.array(step),
            f"{name}.acc": np.array(fair == "acc"),
            f"{name}.out": run(ref, w.copy(), before, after, step, fair),
        }
    w = uniform.copy()
    arrays["seq.weights0"] = w.copy()
    for i in range(COMM):
        before, after = rng.uniform(0.2, 0.6, 4), rng.uniform(0.2, 0.9, 4)
        step = 0.2 - (i - 1) * 0.2 / COMM  # train_pacs_GA.py's schedule, d = 0.2
        w = run(ref, w, before, after, step, "loss")
        arrays |= {
            f"seq.{i}.before": before,
            f"seq.{i}.after": after,
            f"seq.{i}.step": np.array(step),
            f"seq.{i}.out": w.copy(),
        }
    write_fixture(
        "feddg_ga",
        repository=REPO,
        commit=COMMIT,
        function="utils/weight_adjust.py: refine_weight_dict_by_GA",
        arrays=arrays,
        notes=(
            "four sites a-d; <case>.acc: fair_metric 'acc' (else 'loss'). Mapping to AAW "
            "(Pan et al., ICASSP 2025, Eqs. 6-7): AAW step = step_size / 3 (the code's 1/3); "
            "G = after - before for 'loss', before - after for 'acc'; same normalisation by "
            "max |G|, clip to [0, 1], renormalise; schedule step_size(i - 1, comm, d)"
        ),
    )


if __name__ == "__main__":
    main()
