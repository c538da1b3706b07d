"""What ``fedseg flower local``/``server`` show of ``flwr run``: its lines without colour
codes or Flower's app-install chatter on the terminal, everything in its log file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from fedseg.engine.flower.launcher import _pump

# Lines as ``flwr run --stream`` writes them (from a loopback run's flwr-run.log).
FLWR_LINES = [
    "Using SuperLink: fedseg (127.0.0.1:47027)",
    "Successfully started run 18307390874306671641",
    "\x1b[92mINFO \x1b[0m:      Starting logstream for run_id `18307390874306671641`",
    "\x1b[92mINFO \x1b[0m:      Start `flwr-serverapp` process",
    "Successfully installed fedseg-run to /tmp/flwr-home/apps/fedseg.fedseg-run.1.0.0.92fcaee4.",
    "21:09:12 fedseg INFO: waiting for the sites ['A', 'B']",
    "\x1b[93mWARNING \x1b[0m:   site 'B' replied late",
]


def test_flwr_run_lines_shown_clean_and_logged_whole(tmp_path: Path) -> None:
    script = "import sys\nfor line in sys.argv[1:]:\n    print(line, flush=True)\n"
    popen = subprocess.Popen([sys.executable, "-c", script, *FLWR_LINES], stdout=subprocess.PIPE)
    shown: list[str] = []
    assert popen.stdout is not None
    _pump(popen.stdout, tmp_path / "flwr-run.log", shown.append, popen, None)
    popen.wait(timeout=30)
    assert shown == [
        "21:09:12 fedseg INFO: waiting for the sites ['A', 'B']",
        "WARNING :   site 'B' replied late",
    ]
    assert (tmp_path / "flwr-run.log").read_text().splitlines() == FLWR_LINES


def test_results_print_as_fedseg_run_prints_them(tmp_path: Path) -> None:
    """At the end of a Flower run the per-site table is the one ``fedseg run`` shows."""
    import json

    from fedseg.console import console
    from fedseg.engine.flower.cli import _print_results
    from fedseg.run_table import results_table

    block = {"dsc": {"faz": 0.5}, "hd95": {"faz": 3.0}}
    results = {"method": "fedavg", "labels": "full", "cases": {"A": 2}, "sites": {"A": block}}
    results["average"] = block
    (tmp_path / "results.json").write_text(json.dumps(results))
    with console.capture() as got:
        _print_results(tmp_path)
    with console.capture() as want:
        console.print(results_table(results))
    assert got.get().startswith(want.get()) and "50.00" in got.get()
    assert f"run directory: {tmp_path}" in got.get()
