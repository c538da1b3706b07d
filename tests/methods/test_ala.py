import itertools

import pytest
import torch
from torch import nn

from fedseg.errors import ConfigError
from fedseg.methods.ala import init_weights, last_parameters, merge, train_weights


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.Linear(3, 2))


def _batches(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(8, 4, generator=g), torch.randn(8, 2, generator=g)
    return itertools.repeat((x, y))


def _mse(model, x, y):
    return ((model(x) - y) ** 2).mean()


def _states():
    return _model(0).state_dict(), _model(1).state_dict()


def test_merge_is_elementwise_and_unweighted_keys_take_glob():
    prev, glob = _states()
    w = init_weights(glob, ["2.weight", "2.bias"])
    assert all(torch.equal(v, torch.ones_like(v)) for v in w.values())
    w["2.weight"] = torch.rand(w["2.weight"].shape)
    w["2.bias"] = torch.zeros(2)
    out = merge(prev, glob, w)
    assert set(out) == set(glob)
    expect = prev["2.weight"] + (glob["2.weight"] - prev["2.weight"]) * w["2.weight"]
    torch.testing.assert_close(out["2.weight"], expect)
    assert torch.equal(out["2.bias"], prev["2.bias"])  # W = 0 keeps the local tensor
    assert torch.equal(out["0.weight"], glob["0.weight"])  # no weight: server's tensor
    assert torch.equal(out["1.running_mean"], glob["1.running_mean"])


def test_init_weights_rejects_integer_and_unknown_keys():
    _, glob = _states()
    with pytest.raises(ConfigError, match="float"):
        init_weights(glob, ["1.num_batches_tracked"])
    with pytest.raises(ConfigError, match="float"):
        init_weights(glob, ["nope"])


def test_one_step_follows_the_fedala_rule_and_leaves_merge_loaded():
    prev, glob = _states()
    keys = ["2.weight", "2.bias"]
    w0 = init_weights(glob, keys)
    w0["2.weight"].fill_(0.5)
    model = _model(2)
    x, y = next(_batches())
    # expected gradient at the merged point
    ref = _model(2)
    ref.load_state_dict(merge(prev, glob, w0), strict=False)
    ref.train()
    grads = torch.autograd.grad(_mse(ref, x, y), [ref[2].weight, ref[2].bias])
    res = train_weights(model, prev, glob, w0, _batches(), _mse, eta=3.0, steps=1)
    assert res.steps == 1 and not res.skipped
    for k, g in zip(keys, grads, strict=True):
        expect = (w0[k] - 3.0 * g * (glob[k] - prev[k])).clamp(0, 1)
        torch.testing.assert_close(res.weights[k], expect)
    sd = model.state_dict()
    for k, v in res.merged.items():
        torch.testing.assert_close(sd[k], v)
    # running statistics were restored to the merged (server) values
    assert torch.equal(sd["1.running_mean"], glob["1.running_mean"])
    assert torch.equal(w0["2.weight"], torch.full_like(w0["2.weight"], 0.5))  # input untouched


def test_weights_stay_in_unit_interval_and_change():
    prev, glob = _states()
    w = init_weights(glob, last_parameters(_model(0), 4))
    res = train_weights(_model(3), prev, glob, w, _batches(), _mse, eta=50.0, steps=5)
    vals = torch.cat([v.flatten() for v in res.weights.values()])
    assert vals.min() >= 0 and vals.max() <= 1
    assert (vals < 1).any() and len(res.losses) == 5


def test_skipped_when_nothing_to_learn():
    prev, _ = _states()
    w = init_weights(prev, ["2.weight"])
    res = train_weights(_model(3), prev, prev, w, _batches(), _mse, steps=3)
    assert res.skipped and res.steps == 0 and torch.equal(res.weights["2.weight"], w["2.weight"])


def test_settle_stops_when_loss_is_flat_or_at_the_cap():
    prev, glob = _states()
    w = init_weights(glob, ["2.weight"])
    flat = train_weights(
        _model(3), prev, glob, w, _batches(), _mse, settle=True, window=4, tol=1.0, max_steps=50
    )
    assert flat.settled and flat.steps == 5  # needs more than `window` losses
    passes = train_weights(
        _model(3),
        prev,
        glob,
        w,
        _batches(),
        _mse,
        settle=True,
        window=2,
        tol=1.0,
        pass_steps=3,
        max_steps=50,
    )
    assert passes.settled and passes.steps == 9
    capped = train_weights(
        _model(3), prev, glob, w, _batches(), _mse, settle=True, tol=0.0, max_steps=7
    )
    assert not capped.settled and capped.steps == 7


def test_last_parameters_and_bad_keys():
    model = _model(0)
    assert last_parameters(model, 2) == ["2.weight", "2.bias"]
    with pytest.raises(ConfigError):
        last_parameters(model, 0)
    prev, glob = _states()
    with pytest.raises(ConfigError, match="model parameters"):
        train_weights(model, prev, glob, {"1.running_mean": torch.ones(3)}, _batches(), _mse)


def test_adam_update_steps_every_weight_by_eta_in_the_gradient_sign_direction():
    """Adam's first step is eta * sign(gradient) (up to eps), whatever the gradient's scale:
    this is what makes eta the size of a step of W rather than a scale of a tiny gradient."""
    prev, glob = _states()
    keys = ["2.weight", "2.bias"]
    w0 = init_weights(glob, keys)
    w0["2.weight"].fill_(0.5)
    ref = _model(2)
    ref.load_state_dict(merge(prev, glob, w0), strict=False)
    ref.train()
    x, y = next(_batches())
    grads = torch.autograd.grad(_mse(ref, x, y), [ref[2].weight, ref[2].bias])
    res = train_weights(_model(2), prev, glob, w0, _batches(), _mse, eta=0.01, update="adam")
    for k, g in zip(keys, grads, strict=True):
        gw = g * (glob[k] - prev[k])
        expect = (w0[k] - 0.01 * torch.sign(gw)).clamp(0, 1)
        torch.testing.assert_close(res.weights[k], expect, atol=1e-6, rtol=0)
    assert (res.weights["2.weight"] != 0.5).all()  # every element moved by 0.01
    many = train_weights(
        _model(2), prev, glob, w0, _batches(), _mse, eta=0.01, steps=4, update="adam"
    )
    moved = (many.weights["2.weight"] - 0.5).abs()
    assert moved.max() <= 4 * 0.011 and moved.min() > 0  # Adam steps are about eta
    with pytest.raises(ConfigError, match="sgd or adam"):
        train_weights(_model(2), prev, glob, w0, _batches(), _mse, update="rmsprop")


def test_weight_steps_run_under_the_engine_precision():
    """The loss of every weight step is computed under the current precision's autocast
    (``engine.amp``): under bf16 the weights move differently, but close to float32's."""
    from fedseg.methods.training import precision

    prev, glob = _states()
    w = init_weights(glob, last_parameters(_model(0), 2))
    enabled = []

    def loss(model, x, y):  # type: ignore[no-untyped-def]
        enabled.append(torch.is_autocast_enabled("cpu"))
        return _mse(model, x, y)

    full = train_weights(_model(3), prev, glob, w, _batches(), loss, eta=0.5, steps=3)
    with precision("bf16"):
        half = train_weights(_model(3), prev, glob, w, _batches(), loss, eta=0.5, steps=3)
    assert enabled == [False] * 3 + [True] * 3
    for k in w:
        assert not torch.equal(half.weights[k], full.weights[k])
        torch.testing.assert_close(half.weights[k], full.weights[k], atol=0.1, rtol=0)
