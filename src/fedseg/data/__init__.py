"""Federation folders: format, loading, validation, augmentation (see docs/data.md).

Synthetic federations live in ``fedseg.data.synth``, importers in ``fedseg.data.importers``,
weak-label synthesis in ``fedseg.data.weak`` and the ``fedseg data`` commands in
``fedseg.data.cli``. Names are imported on first use, so that ``fedseg --help`` and the
manifest types do not pay for importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fedseg.data.checks import Problem, check_federation, require_valid
    from fedseg.data.federation import FederatedDataset, SiteSplit
    from fedseg.data.manifest import (
        ANNOTATIONS,
        IGNORE_INDEX,
        SPLITS,
        Annotation,
        Manifest,
        SiteInfo,
        Sparsity,
        WeakLabelRecord,
        sparsity_of,
    )
    from fedseg.data.writer import FederationWriter

__all__ = [
    "ANNOTATIONS",
    "IGNORE_INDEX",
    "SPLITS",
    "Annotation",
    "FederatedDataset",
    "FederationWriter",
    "Manifest",
    "Problem",
    "SiteInfo",
    "SiteSplit",
    "Sparsity",
    "WeakLabelRecord",
    "check_federation",
    "require_valid",
    "sparsity_of",
]

_MODULES = {
    "checks": ("Problem", "check_federation", "require_valid"),
    "federation": ("FederatedDataset", "SiteSplit"),
    "writer": ("FederationWriter",),
}
_HOME = {name: module for module, names in _MODULES.items() for name in names}


def __getattr__(name: str) -> object:
    if name not in __all__:
        raise AttributeError(f"module 'fedseg.data' has no attribute {name!r}")
    return getattr(importlib.import_module(f"fedseg.data.{_HOME.get(name, 'manifest')}"), name)
