"""A prototype method written only against the method contract runs unchanged in-process
and over Flower: per-class prototypes (zeros + counts), a variable number of cluster centres
per site, per-site personalised downloads; both engines give bit-identical results."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import pytest
import torch
from flower_helpers import assert_same_metrics, direct_link, make_config

from fedseg.engine.flower.link import run_federation
from fedseg.engine.runner import InProcessRunner
from fedseg.methods import (
    ClientContext,
    ClientResult,
    Method,
    Payload,
    ServerContext,
    ServerResult,
    State,
)
from fedseg.methods.aggregate import weighted_average
from fedseg.methods.base import Template
from fedseg.methods.prototypes import PrototypeAccumulator, prototype_spec, prototype_tensors
from fedseg.methods.registry import METHODS
from fedseg.methods.training import train_steps
from fedseg.models.features import named_features

pytestmark = pytest.mark.flower
LEVEL, DIM = "dec1", 16  # the UNet's full-resolution decoder feature has 16 channels


class ToyPrototypes(Method):
    """FedAvg plus class prototypes: site i sends its K class means and i + 1 'cluster
    centres' (means of chunks of its foreground pixels); each site gets back the centres
    of every other site (a per-site, variable-size download) and pulls its foreground
    features towards their mean."""

    def upload_template(self, model: torch.nn.Module) -> Template:
        k = self.spec.num_classes
        return {
            **super().upload_template(model),
            **prototype_spec("protos", k, DIM),
            "centres": prototype_spec("c", None, DIM)["c"],
        }

    def download_template(self, model: torch.nn.Module) -> Template:
        return {**super().download_template(model), "peers": prototype_spec("p", None, DIM)["p"]}

    def init_server(self, model: torch.nn.Module) -> ServerResult:
        out = super().init_server(model)
        first = next(iter(out.payloads.values()))
        glob = Payload({**first.tensors, "peers": torch.zeros(0, DIM)})
        return ServerResult(dict.fromkeys(out.payloads, glob), {})

    def client_step(self, payload: Payload, state: State, ctx: ClientContext) -> ClientResult:
        model = ctx.model
        self.load(model, Payload(_weights(payload)), state)
        peers = payload.tensors["peers"].to(ctx.device)

        def pull() -> torch.Tensor:
            if len(peers) == 0:
                return torch.zeros((), device=ctx.device)
            images, _ = next(ctx.ordered_batches(2))
            _, feats = named_features(model, images, [LEVEL])
            return 1e-3 * (feats[LEVEL].mean((0, 2, 3)) - peers.mean(0)).pow(2).sum()

        metrics = train_steps(model, ctx, regularizer=pull)
        acc = PrototypeAccumulator(ctx.spec.num_classes, ctx.spec.ignore_index)
        fg: list[torch.Tensor] = []
        model.eval()
        with torch.no_grad():
            for images, labels in ctx.ordered_batches():
                _, feats = named_features(model, images, [LEVEL])
                acc.add(feats[LEVEL], labels)
                f = feats[LEVEL].permute(0, 2, 3, 1)[labels == 1]
                fg.append(f)
        centres = torch.stack([c.mean(0) for c in torch.cat(fg).chunk(ctx.site.index + 1)])
        upload, private = self.split(model)
        upload |= prototype_tensors("protos", *acc.result())
        upload["centres"] = centres.float().cpu()
        return ClientResult(Payload(upload, num_examples=ctx.site.num_train), private, metrics)

    def server_step(
        self, uploads: Mapping[str, Payload], state: State, ctx: ServerContext
    ) -> ServerResult:
        weights = weighted_average(
            {s: Payload(_weights(u), num_examples=u.num_examples) for s, u in uploads.items()}
        )
        payloads = {}
        for site in ctx.spec.site_names:
            others = [u.tensors["centres"] for s, u in uploads.items() if s != site]
            peers = torch.cat(others) if others else torch.zeros(0, DIM)
            payloads[site] = Payload({**weights, "peers": peers})
        sizes = {s: len(u.tensors["centres"]) for s, u in uploads.items()}
        return ServerResult(payloads, state, {"centres": sizes})


def _weights(p: Payload) -> dict[str, torch.Tensor]:
    return {
        k: v
        for k, v in p.tensors.items()
        if k not in ("peers", "centres") and not k.startswith("protos")
    }


@pytest.fixture()
def toy_method(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setitem(METHODS._items, "toy_prototypes", ToyPrototypes)
    return "toy_prototypes"


def test_prototype_method_runs_identically_in_process_and_over_flower(
    federation: Path, tmp_path: Path, toy_method: str
):
    cfg = make_config(federation, toy_method)
    ref = InProcessRunner(cfg, tmp_path / "inproc").run()
    link, st = direct_link(cfg, federation, tmp_path / "flower")
    res = run_federation(cfg, st, link)
    assert_same_metrics(res["sites"], ref["sites"], 0.0)
    rounds = [
        json.loads(x) for x in (tmp_path / "flower" / "rounds.jsonl").read_text().splitlines()
    ]
    ref_rounds = [
        json.loads(x) for x in (tmp_path / "inproc" / "rounds.jsonl").read_text().splitlines()
    ]
    assert [r["clients"] for r in rounds] == [r["clients"] for r in ref_rounds]
    # a variable number of centres per site travelled, and was counted both ways
    assert rounds[0]["server"]["centres"] == {"A": 1, "B": 2}
    up, down = rounds[1]["comm"]["upload"], rounds[1]["comm"]["download"]
    assert up["B"]["values"] - up["A"]["values"] == DIM  # one more centre
    assert down["A"]["values"] - down["B"]["values"] == DIM  # A receives B's two centres
    assert rounds[1]["comm"] == ref_rounds[1]["comm"]
