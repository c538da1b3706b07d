"""The Flower ``ServerApp`` of a fedseg run (``serverapp`` of the app's ``pyproject.toml``).

The engine runs the federation over Flower's Grid and writes data
(:func:`~fedseg.engine.flower.server_app.run_on_grid`); this entry point then renders
``results.md`` and the figures, as ``fedseg run`` does after an in-process run.
"""

from __future__ import annotations

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedseg.engine.flower.server_app import run_on_grid
from fedseg.outputs import write_run_outputs

__all__ = ["app"]

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the experiment carried by the run config, then write its table and figures."""
    run_dir, results = run_on_grid(grid, context)
    write_run_outputs(run_dir, results)
