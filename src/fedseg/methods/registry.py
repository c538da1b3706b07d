"""The method registry: ``@register_method("name")`` on a :class:`Method` subclass."""

from __future__ import annotations

from fedseg.methods.base import Method
from fedseg.registry import Registry

__all__ = ["METHODS", "get_method", "list_methods", "register_method"]

METHODS: Registry[type[Method]] = Registry("method")
register_method = METHODS.register
get_method = METHODS.get
list_methods = METHODS.names
