import json

import matplotlib.image
import pytest

from fedseg.errors import ConfigError
from fedseg.reporting.affinity import last_affinity, plot_affinity


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_plots_the_last_rounds_matrix(tmp_path):
    sites = ["A", "B", "C"]
    m0 = [[1.0, 0.1, 0.2], [0.1, 1.0, 0.3], [0.2, 0.3, 1.0]]
    m1 = [[1.0, 0.5, 0.0], [0.5, 1.0, 0.7], [0.0, 0.7, 1.0]]
    _write(
        tmp_path / "rounds.jsonl",
        [
            {"round": 0, "server": {"affinity": m0, "affinity_sites": sites}},
            {"round": 1, "server": {"affinity": m1, "affinity_sites": sites}},
            {"round": 2, "server": {}},
        ],
    )
    assert last_affinity(tmp_path) == (1, m1, sites)
    out = plot_affinity(tmp_path)
    assert out == tmp_path / "affinity.png"
    img = matplotlib.image.imread(out)
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100


def test_clear_error_without_affinity(tmp_path):
    with pytest.raises(ConfigError, match=r"no rounds\.jsonl"):
        plot_affinity(tmp_path)
    _write(tmp_path / "rounds.jsonl", [{"round": 0, "server": {}}])
    with pytest.raises(ConfigError, match="affinity"):
        plot_affinity(tmp_path)
