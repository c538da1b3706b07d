"""Paper tables in one command (``fedseg reproduce <paper> <table> --budget ...``).

:mod:`fedseg.reproduce.papers` reads the tables and published numbers shipped in
``fedseg/papers/``; :mod:`fedseg.reproduce.harness` runs the rows at a budget and renders
them beside the paper's numbers (docs/reproduce.md).
"""

from fedseg.reproduce.evidence import render_markdown
from fedseg.reproduce.harness import (
    BUDGETS,
    Reproduction,
    RowResult,
    compare_methods,
    reproduce,
    run_config,
)
from fedseg.reproduce.papers import Paper, PaperRow, PaperTable, list_papers, load_paper

__all__ = [
    "BUDGETS",
    "Paper",
    "PaperRow",
    "PaperTable",
    "Reproduction",
    "RowResult",
    "compare_methods",
    "list_papers",
    "load_paper",
    "render_markdown",
    "reproduce",
    "run_config",
]
