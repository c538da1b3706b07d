import torch

from fedseg.engine.simulation import Simulation
from fedseg.methods import TrainSettings, get_method
from fedseg.methods import ala as ala_module
from fedseg.methods import fedala as fedala_module
from fedseg.models import UNet
from fedseg.models.dual_decoder import DualDecoderUNet
from fedseg.testing import toy_federation

TRAIN = TrainSettings(rounds=3, local_iters=2, batch_size=4, augment=False)
HEAD = ["decoder.head.weight", "decoder.head.bias"]


def _sim(**cfg) -> Simulation:
    spec, sites = toy_federation(2)
    cls = get_method("fedala")
    cfg = {"num_pre_loss": 2, "max_start_passes": 4, "eta": 50.0, **cfg}
    return Simulation(cls(cls.Config(**cfg), spec), sites, TRAIN, seed=0)


def test_weights_stay_in_unit_interval_and_persist_across_rounds(monkeypatch):
    sim = _sim()
    calls = []
    real = ala_module.train_weights

    def spy(model, prev, glob, weights, batches, loss_fn, **kw):
        res = real(model, prev, glob, weights, batches, loss_fn, **kw)
        calls.append(({k: v.clone() for k, v in weights.items()}, kw["settle"], res))
        return res

    monkeypatch.setattr(ala_module, "train_weights", spy)
    for r in range(TRAIN.rounds):
        sim.round(r)
    site0 = calls[0::2]  # site0, site1 alternate within a round
    assert site0[0][2].skipped and site0[0][1]  # round 0: local == global, nothing to learn
    assert not site0[1][2].skipped and site0[1][1]  # first real call: the start phase
    assert not site0[2][1]  # later calls: one pass only
    learned = site0[1][2].weights
    assert set(learned) == set(HEAD)
    assert all(float(w.min()) >= 0 and float(w.max()) <= 1 for w in learned.values())
    assert any(float(w.min()) < 1 for w in learned.values())  # W moved away from ones
    passed = site0[2][0]  # round 2 starts from the weights learned in round 1
    assert all(torch.equal(passed[k], learned[k]) for k in HEAD)
    stored = sim.states["site0"]["ala"]
    assert all(torch.equal(stored[k], site0[2][2].weights[k]) for k in HEAD)


def test_lower_layers_take_the_global_model_and_buffers_stay_local():
    sim = _sim()
    for r in range(2):
        sim.round(r)
    glob, state = sim.payloads["site0"], sim.states["site0"]
    model = sim.method.eval_model(glob, state, sim.context(sim.sites["site0"], 2))
    sd = model.state_dict()
    conv = "encoder.blocks.0.0.weight"
    assert torch.equal(sd[conv], glob.tensors[conv])
    mixed = sd["decoder.head.weight"]
    lo = torch.minimum(glob.tensors[HEAD[0]], state["ala_prev"][HEAD[0]])
    hi = torch.maximum(glob.tensors[HEAD[0]], state["ala_prev"][HEAD[0]])
    assert bool(((mixed >= lo - 1e-6) & (mixed <= hi + 1e-6)).all())
    stat = "encoder.blocks.0.1.running_mean"
    assert stat not in glob.tensors
    assert torch.equal(sd[stat], state["weights"][stat])
    assert not torch.equal(state["weights"][stat], sim.states["site1"]["weights"][stat])


def test_ala_layers_select_heads_by_position_per_decoder():
    assert fedala_module.ala_keys(UNet(1, 2), 2) == HEAD
    dual = fedala_module.ala_keys(DualDecoderUNet(1, 2), 2)
    assert dual == [*HEAD, "aux_decoder.head.weight", "aux_decoder.head.bias"]


def test_communication_matches_fedlppa_table_ix():
    parts = get_method("fedala").partition.resolve(UNet(1, 2))
    assert parts.params() == {"total": 1_813_474, "upload": 1_813_474, "download": 1_813_474}
    assert all("running" in k or "num_batches" in k for k in parts.private)
