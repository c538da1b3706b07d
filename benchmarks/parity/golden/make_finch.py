"""Golden fixture for FINCH prototype clustering (tests/fixtures/golden/finch.npz).

Reference: FedPLVM's ``utils.util.cluster_protos_finch`` (TriStonesWang/FedPLVM @ 867b5f1),
which runs the FINCH copy bundled with that repository (``utils/finch.py``) per class with
cosine distance and keeps the last partition's unweighted cluster means; FPL and FedBCS use
the same call. The labels of the last partition of that FINCH copy and of the ``finch-clust``
package (the FINCH authors' release, which fedseg calls) are recorded as well.

    python benchmarks/parity/golden/make_finch.py --git-dir FedPLVM/.git
"""

from __future__ import annotations

import warnings

import numpy as np
from _reference import checkout, load_module, parse_git_dir, write_fixture

REPO, COMMIT = "TriStonesWang/FedPLVM", "867b5f145909b1aac4b29fdd55f491eac2ec5ad4"
SIZES = (40, 12, 5, 2)  # vectors per class; class 1 has three well-separated directions
DIM = 8


def inputs(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Non-negative (post-ReLU-like) float32 vectors ``[N, DIM]`` and their classes."""
    parts, classes = [], []
    for c, n in enumerate(SIZES):
        if c == 1:
            centres = rng.random((3, DIM)) ** 4
            x = centres[np.arange(n) % 3] + 0.05 * rng.random((n, DIM))
        else:
            x = rng.random((n, DIM))
        parts.append(x)
        classes.append(np.full(n, c))
    return np.concatenate(parts).astype(np.float32), np.concatenate(classes).astype(np.int64)


def main() -> None:
    git_dir = parse_git_dir(REPO, __doc__.splitlines()[0])
    root = checkout(git_dir, COMMIT, ["utils/finch.py", "utils/util.py"])
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*pynndescent.*")
        util = load_module(root, "utils/util.py", "utils.util")
        bundled = load_module(root, "utils/finch.py", "utils.finch")
        from finch import FINCH as finch_clust  # the finch-clust package

    vectors, classes = inputs(np.random.default_rng(47))
    by_class = {c: list(vectors[classes == c]) for c in range(len(SIZES))}
    agg, _ = util.cluster_protos_finch(by_class)
    centroids = np.concatenate([np.stack(agg[c]) for c in range(len(SIZES))])
    centroid_classes = np.concatenate([np.full(len(agg[c]), c) for c in range(len(SIZES))])

    labels_bundled, labels_clust = [], []
    for c in range(len(SIZES)):
        x = vectors[classes == c]
        kw = {"initial_rank": None, "req_clust": None, "ensure_early_exit": False}
        cb, _, _ = bundled.FINCH(x, distance="cosine", verbose=False, **kw)
        cc, _, _ = finch_clust(x, distance="cosine", verbose=False, **kw)
        labels_bundled.append(cb[:, -1])
        labels_clust.append(cc[:, -1])

    write_fixture(
        "finch",
        repository=REPO,
        commit=COMMIT,
        function="utils.util.cluster_protos_finch (utils/finch.py FINCH); finch.FINCH",
        arrays={
            "vectors": vectors,
            "classes": classes,
            "centroids": centroids,
            "centroid_classes": centroid_classes.astype(np.int64),
            "labels_bundled": np.concatenate(labels_bundled).astype(np.int64),
            "labels_finch_clust": np.concatenate(labels_clust).astype(np.int64),
        },
        notes="labels_*: last FINCH partition per class (cosine, no early-exit guard)",
    )


if __name__ == "__main__":
    main()
