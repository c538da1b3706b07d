"""The part every private wrapper shares: a :class:`~fedseg.methods.Method` that hands the
model, partition, templates and evaluation to the method it wraps."""

from __future__ import annotations

import torch
from torch import nn

from fedseg.methods import Method
from fedseg.methods.base import ClientContext, Payload, SiteSpec, State, Template
from fedseg.methods.partition import ResolvedPartition
from fedseg.privacy.settings import PrivacySettings

__all__ = ["PrivateWrapper"]


class PrivateWrapper(Method):
    """``inner`` unchanged except for the steps a subclass overrides."""

    def __init__(self, inner: Method, settings: PrivacySettings, name: str, label: str) -> None:
        self.inner, self.settings, self.name = inner, settings, name
        self.config, self.spec, self.model_cfg = inner.config, inner.spec, inner.model_cfg
        self.personalized, self.summary = inner.personalized, f"{inner.summary} ({label})"

    def build_model(self) -> nn.Module:
        return self.inner.build_model()

    def parts(self, model: nn.Module) -> ResolvedPartition:
        return self.inner.parts(model)

    def upload_template(self, model: nn.Module) -> Template:
        return self.inner.upload_template(model)

    def download_template(self, model: nn.Module) -> Template:
        return self.inner.download_template(model)

    def init_client(self, model: nn.Module, site: SiteSpec) -> State:
        return self.inner.init_client(model, site)

    def eval_model(self, payload: Payload, state: State, ctx: ClientContext) -> nn.Module:
        return self.inner.eval_model(payload, state, ctx)

    def segment(self, model: nn.Module, images: torch.Tensor) -> torch.Tensor:
        return self.inner.segment(model, images)

    def load(self, model: nn.Module, payload: Payload, state: State) -> None:
        self.inner.load(model, payload, state)

    def split(self, model: nn.Module) -> tuple[dict[str, torch.Tensor], State]:
        return self.inner.split(model)
