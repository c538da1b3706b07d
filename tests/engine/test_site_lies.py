"""A site that lies, in process: tensors that break their own invariants, the optional bounds
on declared sample counts and on update norms (``screening``)."""

from __future__ import annotations

import dataclasses

import pytest

from fedseg.config import ScreeningSettings, parse_config
from fedseg.engine.loop import RoundPolicy
from fedseg.engine.server import ServerCore
from fedseg.engine.simulation import Simulation
from fedseg.engine.worker import TrainReply
from fedseg.errors import ConfigError, UploadError
from fedseg.methods import Payload, TrainSettings, get_method
from fedseg.models import parse_model
from fedseg.testing import toy_federation

TRAIN = TrainSettings(rounds=1, local_iters=2, batch_size=4, augment=False)
SMALL = {"widths": [4, 8, 16], "dropout": [0, 0, 0]}


def _method(sizes: tuple[int, ...] | None = None):
    """FedAvg on a small UNet over 3 toy sites (declaring ``sizes`` training samples)."""
    spec, sites = toy_federation(3)
    if sizes is not None:
        entries = (
            dataclasses.replace(s, num_train=n) for s, n in zip(spec.sites, sizes, strict=True)
        )
        spec = dataclasses.replace(spec, sites=tuple(entries))
    cls = get_method("fedavg")
    return cls(cls.Config(), spec, parse_model({"name": "unet", **SMALL})), sites


def _honest(server: ServerCore, site: str) -> Payload:
    """The payload ``site`` was sent, uploaded back unchanged (a valid upload)."""
    sent = server.payloads[site]
    tensors = {k: t.clone() for k, t in sent.tensors.items() if k in server.upload_template}
    return Payload(tensors, num_examples=server.spec.site(site).num_train)


@pytest.mark.parametrize(("leaf", "value"), [("running_var", -1e-3), ("num_batches_tracked", -1)])
def test_a_negative_batchnorm_statistic_is_refused(leaf: str, value: float):
    method, _ = _method()
    server = ServerCore(method, TRAIN, 0)
    upload = _honest(server, "site0")
    server.check_upload("site0", upload)  # the unchanged upload is valid
    key = next(k for k in upload.tensors if k.endswith(leaf))
    upload.tensors[key] = upload.tensors[key].clone()
    upload.tensors[key].view(-1)[0] = value
    with pytest.raises(UploadError, match=rf"{key} has negative values"):
        server.check_upload("site0", upload)


def test_sample_count_bound_refuses_a_site_declaring_far_more_than_the_median():
    method, _ = _method((8, 9, 1000))
    ServerCore(method, TRAIN, 0)  # off by default: the large site is taken as it says
    ServerCore(method, TRAIN, 0, ScreeningSettings(max_samples_ratio=200))
    with pytest.raises(ConfigError, match=r"site 'site2' declares 1000 .*max_samples_ratio"):
        ServerCore(method, TRAIN, 0, ScreeningSettings(max_samples_ratio=10))


def test_screening_settings_are_validated():
    raw = {"data": {"root": "unused"}, "screening": {"max_update_norm_ratio": 0.5}}
    with pytest.raises(ConfigError, match="max_update_norm_ratio"):
        parse_config(raw)
    assert parse_config({"data": {"root": "unused"}}).screening == ScreeningSettings()


def _poisoned_round(bound: float | None, scale: float) -> dict:
    """One FedAvg round of 3 sites in process where site2's upload is scaled by ``scale``."""
    method, sites = _method()
    sim = Simulation(method, sites, TRAIN, seed=0)
    sim.server.screening = ScreeningSettings(max_update_norm_ratio=bound)
    sim.loop.policy = RoundPolicy(min_sites=2)
    train = sim.link.train

    def lying(r, payloads):
        for s, reply in train(r, payloads):
            if s == "site2":
                for k, t in reply.upload.tensors.items():
                    if t.is_floating_point():
                        reply.upload.tensors[k] = t * scale
            yield s, reply

    sim.link.train = lying  # type: ignore[method-assign]
    try:
        return sim.round(0)
    finally:
        sim.close()


def test_update_norm_bound_refuses_a_scaled_upload_in_process():
    off = _poisoned_round(None, 1e6)
    assert off["participants"] == ["site0", "site1", "site2"]  # finite: accepted without it
    on = _poisoned_round(10.0, 1e6)
    assert on["participants"] == ["site0", "site1"]
    assert "screening.max_update_norm_ratio" in on["failures"]["site2"]
    honest = _poisoned_round(10.0, 1.0)
    assert honest["participants"] == ["site0", "site1", "site2"] and not honest["failures"]


def test_update_norm_is_the_distance_from_the_payload_sent():
    method, _ = _method()
    server = ServerCore(method, TRAIN, 0)
    upload = _honest(server, "site0")
    assert server.update_norm("site0", upload) == 0.0
    key = next(k for k, t in upload.tensors.items() if t.is_floating_point())
    upload.tensors[key] = upload.tensors[key] + 3.0
    assert server.update_norm("site0", upload) == pytest.approx(
        3.0 * upload.tensors[key].numel() ** 0.5
    )


@pytest.mark.parametrize("bound", [None, 10.0])
def test_unset_screening_passes_replies_as_they_come_without_norms(bound, monkeypatch):
    method, _ = _method()
    server = ServerCore(method, TRAIN, 0, ScreeningSettings(max_update_norm_ratio=bound))
    norms: list[str] = []
    real = server.update_norm
    monkeypatch.setattr(server, "update_norm", lambda s, u: norms.append(s) or real(s, u))
    sent: list[TrainReply] = []

    def replies():
        for s in server.spec.site_names:
            sent.append(TrainReply(_honest(server, s)))
            yield s, sent[-1]

    first, reply = next(server.screen(replies(), {}))
    assert first == "site0" and reply is sent[0]  # the reply itself, not a copy
    if bound is None:  # streamed: the later replies not yet drawn, no norm computed
        assert len(sent) == 1 and norms == []
    else:  # held until all arrived, one norm each
        assert len(sent) == 3 and norms == list(server.spec.site_names)
