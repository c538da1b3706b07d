import pytest
import torch

from fedseg.engine.simulation import Simulation
from fedseg.methods import Payload, ServerContext, TrainSettings, get_method
from fedseg.methods.fedap import STAT, bn_input_stats, fedap_weights
from fedseg.models import UNet
from fedseg.testing import toy_federation

TRAIN = TrainSettings(rounds=3, local_iters=2, batch_size=4, augment=False)


def _stats(*means: float, var: float = 1.0) -> list[dict]:
    """One BN layer with one channel per site."""
    return [{"l": (torch.tensor([m]), torch.tensor([var]))} for m in means]


def test_weights_from_hand_made_statistics():
    # d01 = 1, d02 = 3, d12 = 2 -> affinities 1/d, rows scaled to 1 - m off the diagonal
    w = fedap_weights(_stats(0.0, 1.0, 3.0), momentum=0.5)
    expected = torch.tensor(
        [[0.5, 0.375, 0.125], [0.5 * 2 / 3, 0.5, 0.5 / 3], [0.5 * 0.4, 0.5 * 0.6, 0.5]],
        dtype=torch.float64,
    )
    torch.testing.assert_close(w, expected)
    torch.testing.assert_close(w.sum(1), torch.ones(3, dtype=torch.float64))


def test_weights_follow_the_statistics_mean_and_spread():
    before = fedap_weights(_stats(0.0, 1.0, 3.0), momentum=0.3)
    after = fedap_weights(_stats(0.0, 1.0, 0.2), momentum=0.3)  # site 2 moves next to site 0
    assert after[0, 2] > after[0, 1] and before[0, 2] < before[0, 1]
    # variances count through the standard deviations: sigma = 1, 2, 4 gives d = 1, 3, 2
    spread = [{"l": (torch.zeros(1), torch.tensor([v]))} for v in (1.0, 4.0, 16.0)]
    torch.testing.assert_close(fedap_weights(spread, 0.3), before)
    torch.testing.assert_close(after.sum(1), torch.ones(3, dtype=torch.float64))
    torch.testing.assert_close(after.diagonal(), torch.full((3,), 0.3, dtype=torch.float64))


def test_bn_input_statistics_are_pooled_exactly_in_eval_mode():
    net = UNet(1, 2).train()
    x = [torch.randn(3, 1, 16, 16), torch.randn(2, 1, 16, 16)]
    stats = bn_input_stats(net, iter([(b, None) for b in x]), 2)
    assert len(stats) == 18 and net.training
    conv = net.encoder.blocks[0][0]
    with torch.no_grad():
        feats = torch.cat([conv(b) for b in x]).transpose(0, 1).flatten(1)
    mean, var = stats["encoder.blocks.0.1"]
    torch.testing.assert_close(mean, feats.mean(1))
    torch.testing.assert_close(var, feats.var(1))


def test_server_mixes_non_bn_weights_with_fixed_w():
    cls = get_method("fedap")
    spec, _ = toy_federation(3)
    method = cls(cls.Config(), spec)
    w = [[0.5, 0.25, 0.25], [0.1, 0.8, 0.1], [0.0, 0.5, 0.5]]
    ups = {f"site{i}": Payload({"a": torch.tensor([float(i)])}, num_examples=1) for i in range(3)}
    ctx = ServerContext(spec, 5, TRAIN, torch.Generator())
    out = method.server_step(ups, {"W": w}, ctx)
    got = [float(out.payloads[f"site{i}"].tensors["a"]) for i in range(3)]
    assert got == pytest.approx([0.75, 1.0, 1.5])
    # a site that did not reply: rows are renormalised over the senders
    out = method.server_step({k: ups[k] for k in ("site0", "site1")}, {"W": w}, ctx)
    assert float(out.payloads["site2"].tensors["a"]) == pytest.approx(1.0)


def test_warmup_then_statistics_then_personal_mixtures():
    spec, sites = toy_federation(3)
    cls = get_method("fedap")
    sim = Simulation(cls(cls.Config(warmup_rounds=1), spec), sites, TRAIN, seed=0)
    bn = set(cls.partition.resolve(sim.model).private)
    records = [sim.round(0)]
    assert "W" not in sim.server_state and all(p.metrics for p in sim.payloads.values())
    conv = "encoder.blocks.0.0.weight"
    same = [sim.payloads[s].tensors[conv] for s in sites]
    assert all(torch.equal(same[0], t) for t in same)  # warm-up: one FedBN model
    records.append(sim.round(1))
    w = torch.tensor(sim.server_state["W"], dtype=torch.float64)
    assert records[1]["server"]["fedap_W"] == sim.server_state["W"]
    torch.testing.assert_close(w.sum(1), torch.ones(3, dtype=torch.float64))
    torch.testing.assert_close(w.diagonal(), torch.full((3,), 0.5, dtype=torch.float64))
    mixed = [sim.payloads[s].tensors[conv] for s in sites]
    assert not torch.equal(mixed[0], mixed[1])  # personal mixtures
    for p in sim.payloads.values():
        assert not bn & set(p.tensors) and not p.metrics  # BN local; no more requests
    sim.round(2)
    assert sim.server_state["W"] == w.tolist()  # computed once, kept fixed


def test_upload_carries_statistics_only_when_asked():
    spec, sites = toy_federation(2)
    cls = get_method("fedap")
    sim = Simulation(cls(cls.Config(warmup_rounds=0), spec), sites, TRAIN, seed=0)
    res = sim.method.client_step(
        sim.payloads["site0"], sim.states["site0"], sim.context(sim.sites["site0"], 0)
    )
    stats = {k: v for k, v in res.upload.tensors.items() if k.startswith(STAT)}
    assert len(stats) == 36 and all(v.abs().sum() > 0 for v in stats.values())
    quiet = Payload(sim.payloads["site0"].tensors)
    res = sim.method.client_step(quiet, sim.states["site0"], sim.context(sim.sites["site0"], 0))
    assert all(
        float(v.abs().sum()) == 0 for k, v in res.upload.tensors.items() if k.startswith(STAT)
    )


def test_communication_matches_fedlppa_table_ix():
    parts = get_method("fedap").partition.resolve(UNet(1, 2))
    assert parts.params() == {"total": 1_813_474, "upload": 1_810_530, "download": 1_810_530}
