import dataclasses
import math

import pytest
import torch

from fedseg.engine.simulation import Simulation
from fedseg.engine.sites import client_context
from fedseg.errors import ConfigError
from fedseg.methods import Payload, ServerContext, TrainSettings, get_method
from fedseg.methods.aggregate import weighted_average
from fedseg.methods.fedlppa import FedLPPAConfig, aux_mixing, la_statistics
from fedseg.models.tdf import asp_planes, prompt_affinity
from fedseg.testing import toy_federation

FAST = TrainSettings(rounds=2, local_iters=2, batch_size=4, augment=False)


def _method(spec, **config):
    """FedLPPA as fedseg reads the paper (``variant: paper``, whose mechanics these tests
    check; the authors' variant: tests/methods/test_variant_authors.py), or as given."""
    return get_method("fedlppa")(FedLPPAConfig(**{"variant": "paper", **config}), spec)


def _uploads(method, model, names, seed=0):
    """Hand-made uploads: the model's upload keys shifted by a per-site constant."""
    sd = model.state_dict()
    g = torch.Generator().manual_seed(seed)
    out = {}
    for i, name in enumerate(names):
        t = {
            k: sd[k] + (i + 1) * 0.1 if sd[k].is_floating_point() else sd[k].clone()
            for k in method.parts(model).upload
        }
        t["tdf.ddp"] = torch.randn(sd["tdf.ddp"].shape, generator=g)
        out[name] = Payload(t, num_examples=10 * (i + 1))
    return out


def _server(method, uploads, seed=0):
    spec = method.spec
    return method.server_step(
        uploads, {}, ServerContext(spec, 0, FAST, torch.Generator().manual_seed(seed))
    )


# -- server side ----------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(30))
def test_random_never_gives_a_site_its_own_decoder(seed):
    mix = aux_mixing("random", None, [0, 1, 2, 3], 5, torch.Generator().manual_seed(seed))
    assert torch.equal(mix.sum(1), torch.ones(5)) and ((mix == 0) | (mix == 1)).all()
    assert (torch.diag(mix) == 0).all()
    assert (mix[:4, :4].sum(0) == 1).all()  # uploaded decoders are dealt out once each
    assert (mix[:, 4] == 0).all()  # site 4 did not upload


def test_fixed_order_and_highest_similarity():
    fixed = aux_mixing("fixed_order", None, [0, 1, 2], 3, torch.Generator())
    assert fixed.argmax(1).tolist() == [2, 0, 1]
    skip = aux_mixing("fixed_order", None, [0, 2], 3, torch.Generator())  # site 1 missing
    assert skip.argmax(1).tolist() == [2, 0, 0]
    aff = torch.tensor([[1.0, 0.2, 0.7], [0.2, 1.0, 0.1], [0.7, 0.1, 1.0]])
    hps = aux_mixing("highest_similarity", aff, [0, 1, 2], 3, torch.Generator())
    assert hps.argmax(1).tolist() == [2, 0, 0]


@pytest.mark.parametrize("include_self", [True, False])
def test_similarity_aggregated_rows_are_normalised_affinities(include_self):
    aff = torch.tensor([[1.0, 0.0, 0.5], [0.0, 1.0, 0.25], [0.5, 0.25, 1.0]])
    mix = aux_mixing("similarity_aggregated", aff, [0, 1, 2], 3, torch.Generator(), include_self)
    torch.testing.assert_close(mix.sum(1), torch.ones(3))
    expect = aff if include_self else aff - torch.eye(3)
    torch.testing.assert_close(mix, expect / expect.sum(1, keepdim=True))


def _own_slots(uploads, spec):
    """The DDP with slot i taken from site i's upload."""
    return torch.stack([uploads[s.name].tensors["tdf.ddp"][s.index] for s in spec.sites])


@pytest.mark.parametrize("prompts", ["uploaded", "aggregated"])
def test_affinity_compares_the_uploaded_or_the_aggregated_ddp_slots(prompts):
    spec, _ = toy_federation(3, size=32)
    method = _method(spec, affinity_prompts=prompts)
    uploads = _uploads(method, method.build_model(), spec.site_names)
    out = _server(method, uploads)
    glob = weighted_average(uploads)
    ddp = _own_slots(uploads, spec) if prompts == "uploaded" else glob["tdf.ddp"]
    aff = prompt_affinity(ddp, glob["tdf.ukp"])  # one UKP, the averaged one (Eq. 7)
    torch.testing.assert_close(torch.tensor(out.metrics["affinity"]), aff)
    other = prompt_affinity(
        glob["tdf.ddp"] if prompts == "uploaded" else _own_slots(uploads, spec), glob["tdf.ukp"]
    )
    assert not torch.allclose(aff, other)


def test_matrices_are_logged_up_to_a_number_of_sites():
    """Above ``log_matrices_up_to`` sites the N x N matrices stay out of the server metrics
    (their summaries stay); the payloads are the same either way."""
    spec, _ = toy_federation(3, size=32)
    full, capped = _method(spec), _method(spec, log_matrices_up_to=2)
    uploads = _uploads(full, full.build_model(), spec.site_names)
    a, b = _server(full, uploads), _server(capped, uploads)
    assert {"affinity", "affinity_sites", "aux_weights"} <= set(a.metrics)
    assert not {"affinity", "affinity_sites", "aux_weights"} & set(b.metrics)
    for key in ("affinity_change", "affinity_drift", "aux_self_weight"):
        assert a.metrics[key] == b.metrics[key]
    for name in spec.site_names:
        for key, value in a.payloads[name].tensors.items():
            assert torch.equal(value, b.payloads[name].tensors[key]), (name, key)


@pytest.mark.parametrize("rule", ["fedavg", "owner"])
def test_ddp_slot_of_a_site_is_averaged_or_taken_from_its_owner(rule):
    spec, _ = toy_federation(3, size=32)
    method = _method(spec, ddp_aggregation=rule)
    uploads = _uploads(method, method.build_model(), spec.site_names)
    del uploads["site2"]  # a site that did not upload keeps the averaged (unchanged) slot
    glob = weighted_average(uploads)
    sent = _server(method, uploads).payloads["site0"].tensors["tdf.ddp"]
    if rule == "fedavg":
        torch.testing.assert_close(sent, glob["tdf.ddp"])
    else:
        for s in spec.sites[:2]:
            torch.testing.assert_close(sent[s.index], uploads[s.name].tensors["tdf.ddp"][s.index])
    torch.testing.assert_close(sent[2], glob["tdf.ddp"][2])


@pytest.mark.parametrize("source", ["main", "aux"])
def test_server_averages_globals_and_builds_aux_from_main_or_aux_decoders(source):
    spec, _ = toy_federation(3, size=32)
    method = _method(spec, aux_source=source)
    model = method.build_model()
    uploads = _uploads(method, model, spec.site_names)
    sent = set(uploads[spec.site_names[0]].tensors)
    assert any(k.startswith("aux_decoder.") for k in sent) == (
        source == "aux"
    )  # the paper's sites never upload the aux decoder
    out = _server(method, uploads)
    glob = weighted_average(uploads)
    aff = prompt_affinity(_own_slots(uploads, spec), glob["tdf.ukp"])
    torch.testing.assert_close(torch.tensor(out.metrics["affinity"]), aff)
    mix = torch.tensor(out.metrics["aux_weights"])
    torch.testing.assert_close(mix, aff / aff.sum(1, keepdim=True))
    key = "decoder.ups.0.reduce.weight"
    for i, name in enumerate(spec.site_names):
        p = out.payloads[name].tensors
        torch.testing.assert_close(
            p["encoder.blocks.0.0.weight"], glob["encoder.blocks.0.0.weight"]
        )
        torch.testing.assert_close(p[key], glob[key])  # phi_G: sample-weighted average
        mixed = key if source == "main" else "aux_" + key
        want = sum(mix[i, j] * uploads[n].tensors[mixed] for j, n in enumerate(spec.site_names))
        torch.testing.assert_close(p["aux_" + key], want)
        assert set(p) == set(model.state_dict())


def test_server_random_strategy_payloads_differ_from_own_decoder():
    spec, _ = toy_federation(3, size=32)
    method = _method(spec, aux_strategy="random")
    uploads = _uploads(method, method.build_model(), spec.site_names)
    for seed in range(5):
        out = _server(method, uploads, seed)
        for name in spec.site_names:
            aux = out.payloads[name].tensors["aux_decoder.head.weight"]
            own = uploads[name].tensors["decoder.head.weight"]
            assert not torch.allclose(aux, own)
            assert any(torch.equal(aux, u.tensors["decoder.head.weight"]) for u in uploads.values())


def test_without_pd_every_site_gets_the_global_model():
    spec, _ = toy_federation(2, size=32)
    method = _method(spec, pd=False)
    model = method.build_model()
    assert not any(k.startswith("aux_") for k in model.state_dict())
    out = _server(method, _uploads(method, model, spec.site_names))
    assert out.payloads["site0"] is out.payloads["site1"] and "affinity" in out.metrics


# -- client side ----------------------------------------------------------------------------


def _step(method, sites, payload, state, train=FAST, name="site1"):
    model = method.build_model()
    ctx = client_context(
        sites[name],
        method.spec,
        train,
        round_index=1,
        seed=0,
        model=model,
        device=torch.device("cpu"),
    )
    return model, method.client_step(payload, state, ctx)


@pytest.mark.parametrize("w", [1.0, 0.0])
def test_la_weights_one_give_the_global_decoder_zero_the_local_one(w):
    spec, sites = toy_federation(2, size=32)
    method = _method(spec, la_eta=0.0)  # weights never move
    model = method.build_model()
    payload = method.init_server(model).payloads["site1"]
    state = method.init_client(model, spec.sites[1])
    prev = {k: v + 0.05 for k, v in state["decoders"].items()}  # last round's own decoders
    weights = {k: torch.full_like(v, w) for k, v in state["la"].items()}
    state = {"decoders": prev, "la": weights, "la_started": True}
    _, res = _step(method, sites, payload, state, FAST.model_copy(update={"local_iters": 0}))
    want = payload.tensors if w == 1.0 else prev
    for k in ("decoder.ups.1.conv.0.weight", "mlp.net.0.weight", "decoder.head.bias"):
        torch.testing.assert_close(res.upload.tensors[k], want[k])
    for k in ("aux_decoder.ups.1.conv.0.weight", "aux_decoder.head.bias"):
        torch.testing.assert_close(res.state["decoders"][k], want[k])


def test_la_merge_eval_trains_from_the_received_decoders_and_evaluates_the_merge():
    spec, sites = toy_federation(2, size=32)
    method = _method(spec, la_eta=0.0, la_merge="eval")
    model = method.build_model()
    payload = method.init_server(model).payloads["site1"]
    state = method.init_client(model, spec.sites[1])
    prev = {k: v + 0.05 for k, v in state["decoders"].items()}
    weights = {k: torch.zeros_like(v) for k, v in state["la"].items()}  # the merge: prev
    state = {"decoders": prev, "la": weights, "la_started": True}
    settings = FAST.model_copy(update={"local_iters": 0})
    _, res = _step(method, sites, payload, state, settings)
    assert res.metrics["la_steps"] > 0  # LA ran, and its merge did not reach training
    for k in ("decoder.ups.1.conv.0.weight", "mlp.net.0.weight", "decoder.head.bias"):
        torch.testing.assert_close(res.upload.tensors[k], payload.tensors[k])
    ctx = client_context(sites["site1"], spec, settings, round_index=1, seed=0, model=model,
                         device=torch.device("cpu"))  # fmt: skip
    evaluated = method.eval_model(payload, {**res.state, "decoders": prev}, ctx).state_dict()
    for k in ("decoder.ups.1.conv.0.weight", "decoder.head.bias"):
        torch.testing.assert_close(evaluated[k], prev[k])


def test_upload_holds_only_the_declared_keys_and_other_ddp_slots_are_untouched():
    spec, sites = toy_federation(3, size=32)
    method = _method(spec)
    model = method.build_model()
    payload = method.init_server(model).payloads["site1"]
    _, res = _step(method, sites, payload, method.init_client(model, spec.sites[1]))
    parts = method.parts(model)
    keys = [k for k in model.state_dict() if not k.startswith("aux_decoder.")]
    assert list(res.upload.tensors) == keys == list(parts.upload)
    aux = sum(p.numel() for p in model.aux_decoder.parameters())
    assert parts.count(res.upload.tensors) == parts.params()["total"] - aux
    ddp_new, ddp_old = res.upload.tensors["tdf.ddp"], payload.tensors["tdf.ddp"]
    assert torch.equal(ddp_new[[0, 2]], ddp_old[[0, 2]]) and not torch.equal(ddp_new[1], ddp_old[1])
    logged = {"sup", "pse", "pce_main", "pce_aux", "dice_main", "dice_aux", "la_steps"}
    assert math.isfinite(res.metrics["loss"]) and logged <= set(res.metrics)


def test_config_validation():
    with pytest.raises(ValueError, match="ddp"):
        FedLPPAConfig(prompts=("ukp", "asp"))
    with pytest.raises(ValueError, match="needs tdf"):
        FedLPPAConfig(tdf=False)
    with pytest.raises(ValueError, match="mix_low"):
        FedLPPAConfig(mix_low=0.9, mix_high=0.8)
    with pytest.raises(ValueError, match=r"la_eta 1\.0 with la_update adam"):
        FedLPPAConfig(variant="paper", la_eta=1.0)
    with pytest.raises(ValueError, match=r"variant 'authors' sets method\.la_update: 'sgd'"):
        FedLPPAConfig(la_update="adam")
    FedLPPAConfig(la_update="sgd", la_eta=1.0)
    FedLPPAConfig(tdf=False, aux_strategy="fixed_order")
    spec, _ = toy_federation(2, size=32)
    with pytest.raises(ConfigError, match="image size"):
        get_method("fedlppa")(FedLPPAConfig(), type(spec)(**{**spec.__dict__, "image_size": ()}))


# -- end to end -----------------------------------------------------------------------------


def test_simulation_trains_persists_la_weights_and_evaluates():
    spec, sites = toy_federation(3, size=32)
    method = _method(spec, la_update="sgd", la_eta=1e4, la_max_iters=2, la_iters=0)
    sim = Simulation(method, sites, FAST.model_copy(update={"rounds": 3, "local_iters": 1}), seed=0)
    records = [sim.round(0), sim.round(1)]
    after1 = {n: {k: v.clone() for k, v in s["la"].items()} for n, s in sim.states.items()}
    records.append(sim.round(2))
    steps = [[c["la_steps"] for c in rec["clients"].values()] for rec in records]
    assert steps == [[0, 0, 0], [2, 2, 2], [0, 0, 0]]  # skipped, settling phase, la_iters
    for name, state in sim.states.items():
        w = torch.cat([v.flatten() for v in state["la"].values()])
        assert w.min() >= 0 and w.max() <= 1 and (w < 1).any()
        assert state["la_started"]
        for k, v in state["la"].items():  # kept from round 1: no LA step ran in round 2
            assert torch.equal(v, after1[name][k])
    aff = torch.tensor(records[-1]["server"]["affinity"])
    assert aff.shape == (3, 3) and torch.allclose(torch.diag(aff), torch.ones(3))
    server = [rec["server"] for rec in records]
    assert server[0]["affinity_change"] == 0 == server[0]["affinity_drift"]
    first = torch.tensor(server[0]["affinity"])
    assert server[2]["affinity_drift"] == pytest.approx(float((aff - first).abs().max()))
    before = torch.tensor(server[1]["affinity"])
    assert server[2]["affinity_change"] == pytest.approx(float((aff - before).abs().max()))
    for c in records[1]["clients"].values():  # LA ran: its weights and shares are logged
        assert 0 <= c["la_main_min"] <= c["la_main_mean"] <= 1
        assert 0 <= c["la_aux_local_share"] <= 1 and 0 <= c["la_main_local_share"] <= 1
    results = sim.evaluate(regions={"fg": [1]})
    for res in results.values():
        assert res["cases"] == 4 and 0 <= res["metrics"]["dsc"]["fg"] <= 1
    assert all(math.isfinite(c["loss"]) for rec in records for c in rec["clients"].values())


# -- fidelity fixes (issue 12) ---------------------------------------------------------------


@pytest.mark.parametrize("labels", ["weak", "full"])
def test_full_labels_give_every_site_the_all_zero_prompt(labels):
    """``data.labels: full`` on a weakly annotated federation: the sites keep their weak
    annotation in the spec, but they train on full masks, so their ASP is all zeros."""
    spec, sites = toy_federation(3, size=32)
    spec = dataclasses.replace(spec, labels=labels)
    method = _method(spec)
    for name, site in sites.items():
        model, _ = _step(
            method,
            sites,
            method.init_server(method.build_model()).payloads[name],
            method.init_client(method.build_model(), site.spec),
            name=name,
        )
        want = asp_planes(None if labels == "full" else site.spec.sparsity)
        assert site.spec.sparsity is not None
        torch.testing.assert_close(model.tdf.asp, want)
        ctx = client_context(
            site, spec, FAST, round_index=1, seed=0, model=model, device=torch.device("cpu")
        )
        evaluated = method.eval_model(method.init_server(model).payloads[name], {}, ctx)
        torch.testing.assert_close(evaluated.tdf.asp, want)
        assert bool(want.any()) == (labels == "weak")


def test_la_learning_rate_rule():
    """la_eta None: the round's train lr (poly schedule) with adam, 1.0 with sgd."""
    spec, sites = toy_federation(2, size=32)
    train = FAST.model_copy(update={"lr": 0.01, "rounds": 4})
    ctx = client_context(
        sites["site0"],
        spec,
        train,
        round_index=2,
        seed=0,
        model=_method(spec).build_model(),
        device=torch.device("cpu"),
    )
    assert _method(spec)._la_eta(ctx) == pytest.approx(0.01 * (1 - 2 / 4) ** 0.9)
    assert _method(spec, la_update="sgd")._la_eta(ctx) == 1.0
    assert _method(spec, la_eta=0.05)._la_eta(ctx) == 0.05


def test_default_la_moves_weights_by_the_learning_rate_not_by_the_gradient_scale():
    """With the default (adam at the run's lr) the settling LA moves the weights by up to
    lr per step; the plain step with eta 1 leaves them near 1 (issue 12)."""
    spec, sites = toy_federation(2, size=32)
    train = FAST.model_copy(update={"lr": 0.01, "rounds": 2, "local_iters": 2})
    moved = {}
    for update in ("adam", "sgd"):
        method = _method(spec, la_update=update, la_max_iters=5, la_iters=0)
        sim = Simulation(method, sites, train, seed=0)
        sim.round(0)
        rec = sim.round(1)
        eta = rec["clients"]["site0"]["la_eta"]
        w = torch.cat([v.flatten() for v in sim.states["site0"]["la"].values()])
        steps = rec["clients"]["site0"]["la_steps"]
        assert steps == 5 and w.min() >= 0 and w.max() <= 1
        if update == "adam":
            assert eta == pytest.approx(0.01 * (1 - 1 / 2) ** 0.9)
            assert (1 - w).max() <= steps * eta * 1.1
        moved[update] = float((1 - w).mean())
    assert moved["adam"] > 100 * moved["sgd"]


def test_la_statistics_local_share():
    prev = {"decoder.a": torch.tensor([1.0, 2.0]), "aux_decoder.a": torch.tensor([0.0, 3.0])}
    glob = {"decoder.a": torch.tensor([0.0, 0.0]), "aux_decoder.a": torch.tensor([0.0, 3.0])}
    w = {"decoder.a": torch.tensor([0.5, 0.5]), "aux_decoder.a": torch.tensor([0.0, 1.0])}
    stats = la_statistics(prev, glob, w)
    assert stats["la_main_mean"] == 0.5 and stats["la_main_min"] == 0.5
    assert stats["la_main_local_share"] == pytest.approx(0.5)  # halfway back to its own
    assert stats["la_aux_local_share"] == 0.0  # nothing of its own to keep
    w["decoder.a"] = torch.zeros(2)
    assert la_statistics(prev, glob, w)["la_main_local_share"] == pytest.approx(1.0)


def test_server_keeps_of_each_upload_only_its_ddp_slot_and_main_decoder():
    """Uploads are reduced on arrival (as FedAvg's): while a site trains, at most the
    previous site's whole upload is alive; the server kept copies of what Eqs. 7-9 need."""
    import gc
    import weakref

    spec, sites = toy_federation(4, size=32)
    sim = Simulation(_method(spec), sites, FAST, seed=0)
    refs: list[weakref.ref] = []
    alive_at_start: list[int] = []
    for worker in sim.link.workers.values():

        def train(r, payload, _orig=worker.train):  # type: ignore[no-untyped-def]
            gc.collect()
            alive_at_start.append(sum(ref() is not None for ref in refs))
            res, start = _orig(r, payload)
            refs.append(weakref.ref(res.upload.tensors["encoder.blocks.0.0.weight"]))
            refs.append(weakref.ref(res.upload.tensors["decoder.head.weight"]))
            return res, start

        worker.train = train
    record = sim.round(0)
    assert alive_at_start == [0, 2, 2, 2]
    assert len(record["server"]["aux_weights"]) == 4
