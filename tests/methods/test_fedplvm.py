import pytest
import torch
import torch.nn.functional as F

from fedseg.engine.simulation import Simulation
from fedseg.errors import UploadError
from fedseg.methods import Payload, ServerContext, TrainSettings, get_method
from fedseg.methods.base import validate_upload
from fedseg.methods.clustered_prototypes import aggregation_weights, prototype_infonce
from fedseg.methods.fedplvm import correction_loss, image_class_means
from fedseg.testing import toy_federation

pytestmark = pytest.mark.filterwarnings("ignore:.*pynndescent.*")

TRAIN = TrainSettings(rounds=3, local_iters=2, batch_size=4, augment=False)
DIM = 16  # channels of the default UNet's dec1


def _sim(sites: int = 3, **cfg) -> Simulation:
    spec, data = toy_federation(sites, labels="full")
    cls = get_method("fedplvm")
    return Simulation(cls(cls.Config(**cfg), spec), data, TRAIN, seed=8)


def test_number_of_uploaded_prototypes_varies_across_sites_and_rounds():
    sim = _sim()
    weights = sum(t.numel() for t in sim.model.state_dict().values())
    counts = []
    for r in range(3):
        record = sim.round(r)
        assert record["failures"] == {}  # every variable-size upload passed the template
        sent = record["server"]["prototypes"]
        for site, n in sent.items():
            assert n >= 2  # at least one local cluster per class
            assert record["comm"]["upload"][site]["values"] == weights + n * (DIM + 1)
            assert record["clients"][site]["prototypes"] == n
        counts.append(sent)
        assert 0 < record["server"]["global_prototypes"] < sum(sent.values())
    values = [n for c in counts for n in c.values()]
    assert len(set(values)) > 1
    # the template fixes only the feature dimension and the dtypes
    upload = Payload(dict(sim.payloads["site0"].tensors), num_examples=8)
    for k in ("global_protos", "global_protos.label", "mean_protos", "mean_protos.count"):
        del upload.tensors[k]
    for n in (0, 3, 11):
        upload.tensors["local_protos"] = torch.rand(n, DIM)
        upload.tensors["local_protos.label"] = torch.zeros(n, dtype=torch.long)
        validate_upload("site0", upload, sim.template)
    upload.tensors["local_protos"] = torch.rand(3, DIM + 1)
    with pytest.raises(UploadError, match="local_protos"):
        validate_upload("site0", upload, sim.template)
    # round 1 had no global prototypes: no prototype loss; later rounds have one
    assert record["clients"]["site0"]["proto_loss"] > 0


def test_server_clusters_pooled_prototypes_per_class():
    spec, _ = toy_federation(2, labels="full")
    cls = get_method("fedplvm")
    method = cls(cls.Config(weighting="uniform"), spec)
    gen = torch.Generator().manual_seed(9)
    a, b = torch.rand(4, generator=gen), torch.rand(4, generator=gen)
    near = [v + 0.001 * torch.rand(3, 4, generator=gen) for v in (a, b)]  # class 1, 2 groups
    bg = torch.rand(2, 4, generator=gen)  # class 0: 2 vectors -> one cluster

    def upload(w: float, protos: torch.Tensor, labels: list[int], n: int) -> Payload:
        tensors = {"w": torch.tensor([w]), "local_protos": protos}
        tensors["local_protos.label"] = torch.tensor(labels)
        return Payload(tensors, num_examples=n)

    uploads = {
        "site0": upload(1.0, torch.cat([near[0][:2], near[1][:1], bg[:1]]), [1, 1, 1, 0], 10),
        "site1": upload(3.0, torch.cat([near[0][2:], near[1][1:], bg[1:]]), [1, 1, 1, 0], 30),
    }
    ctx = ServerContext(spec, 0, TRAIN, torch.Generator())
    out = method.server_step(uploads, {}, ctx)
    t = out.payloads["site0"].tensors
    assert t["w"].item() == 2.0  # uniform weighting (FedPLVM's code); default: by samples
    assert t["global_protos.label"].tolist() == [0, 1, 1]
    torch.testing.assert_close(t["global_protos"][0], bg.mean(0))
    glob = t["global_protos"][1:]
    group = glob[torch.cdist(a[None], glob).argmin()]
    torch.testing.assert_close(group, near[0].mean(0))
    assert t["mean_protos.count"].tolist() == [1, 2]
    torch.testing.assert_close(t["mean_protos"][1], glob.mean(0))
    assert out.metrics["prototypes"] == {"site0": 4, "site1": 4}
    assert aggregation_weights(uploads, "samples") == {"site0": 0.25, "site1": 0.75}


def test_alpha_sparsity_loss():
    pos, neg = torch.eye(4)[:1], torch.eye(4)[1:2]
    protos, proto_cls = torch.cat([pos, neg]), torch.tensor([1, 0])
    y = torch.tensor([1])

    def run(alpha: float) -> tuple[torch.Tensor, torch.Tensor]:
        f = torch.tensor([[1.0, 0.05, 0.3, 0.0]], requires_grad=True)
        loss = prototype_infonce(f, y, protos, proto_cls, 0.07, alpha)
        loss.backward()
        return loss.detach(), f.grad

    # the formula: similarities cos^alpha / tau
    f = torch.tensor([[1.0, 0.05, 0.3, 0.0]])
    s = (F.normalize(f, dim=1) @ protos.T).pow(0.25) / 0.07
    torch.testing.assert_close(run(0.25)[0], -(s[0, 0].exp() / s.exp().sum()).log())
    # a nearly orthogonal negative is still pushed away with alpha < 1 (sparser features),
    # while plain InfoNCE (alpha = 1) has already stopped pushing
    (l1, g1), (la, ga) = run(1.0), run(0.25)
    assert la > 100 * l1
    assert ga[0, 1] > 100 * g1[0, 1] > 0  # descent lowers the negative's coordinate
    # negative cosines are clamped: finite, no gradient through them
    f = torch.tensor([[-1.0, -1.0, 0.0, 0.0]], requires_grad=True)
    loss = prototype_infonce(f, y, protos, proto_cls, 0.07, 0.25)
    loss.backward()
    assert torch.isfinite(loss) and torch.equal(f.grad, torch.zeros_like(f))


def test_correction_loss_and_image_class_means():
    means = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    counts = torch.tensor([1, 2, 0])
    f = torch.tensor([[1.0, 1.0], [0.0, 2.0], [5.0, 5.0]])
    y = torch.tensor([0, 1, 2])  # class 2 has no mean prototype: skipped
    expected = 2 * ((2**-0.5 - 1) ** 2 + 0.0) / 2
    assert correction_loss(f, y, means, counts).item() == pytest.approx(expected)
    feats = torch.arange(16, dtype=torch.float32).view(2, 2, 2, 2)  # [B, D, H, W]
    labels = torch.tensor([[[0, 0], [1, 255]], [[1, 1], [1, 1]]])
    m, c = image_class_means(feats, labels, 2, 255)
    assert c.tolist() == [0, 1, 1]
    torch.testing.assert_close(m, torch.tensor([[0.5, 4.5], [2.0, 6.0], [9.5, 13.5]]))


def test_site_clustering_unit_runs_and_sends_fewer_prototypes():
    per_batch, per_site = _sim(sites=2), _sim(sites=2, cluster_unit="site")
    a, b = per_batch.round(0), per_site.round(0)
    assert b["failures"] == {}
    for site in ("site0", "site1"):
        assert 2 <= b["server"]["prototypes"][site] <= a["server"]["prototypes"][site]
