"""Federated methods, one module each; every module in this package registers itself."""

from __future__ import annotations

import importlib
import pkgutil

from fedseg.methods.base import (
    ClientContext,
    ClientResult,
    FederationSpec,
    Method,
    MethodConfig,
    Payload,
    ServerContext,
    ServerResult,
    SiteSpec,
    State,
    TrainSettings,
)
from fedseg.methods.partition import Partition, modules_of_type
from fedseg.methods.registry import get_method, list_methods, register_method

__all__ = [
    "ClientContext",
    "ClientResult",
    "FederationSpec",
    "Method",
    "MethodConfig",
    "Partition",
    "Payload",
    "ServerContext",
    "ServerResult",
    "SiteSpec",
    "State",
    "TrainSettings",
    "get_method",
    "list_methods",
    "modules_of_type",
    "register_method",
]

# Import every module so that each method's @register_method runs; helper modules
# (base, ala, wss, ...) register nothing and importing them is harmless.
for _info in pkgutil.iter_modules(__path__):
    if not _info.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_info.name}")
