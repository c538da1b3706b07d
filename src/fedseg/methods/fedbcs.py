"""FedBCS (Zhao et al., AAAI 2026): style-recalibrated, context-aware dual-level prototypes.

* FSR (:class:`~fedseg.models.fsr.FSR`) recalibrates the style of encoder levels 2 .. L-1
  (enc2-enc4 of the 5-level UNet) inside the network; its output feeds pooling and skip.
* CDPA: every shallow encoder level is concatenated with the (nearest-upsampled) deepest
  encoder level and fused to ``fusion_dim`` channels by a 1x1 convolution; the fused maps are
  resized to the first one's size and concatenated (768-d at full resolution on HarmoFL's
  UNet); the decoder branch does the same with dec3..dec1 and dec4 (768-d at H/4).
* Each site uploads per-class prototypes of both branches (mean of per-batch class means
  over the last local epoch, pre-step features); the server clusters each class's client
  prototypes with FINCH and sends back all cluster centres.
* Local loss on foreground pixels: Dice+CE + mean over branches of L_contra (InfoNCE over
  the cluster centres, temperature ``tau``, exact by log-sum-exp) + L_consis (MSE to the
  class's mean centre, as the code; ``consis_form: sum`` is Eq. 16's unnormalised sum).
* Weights: sample-count-weighted FedAvg of everything (the paper's supplement, Eq. 27).

Reference: Zhao et al., "Divide, Conquer and Unite: Hierarchical Style-Recalibrated Prototype
Alignment for Federated Medical Image Segmentation", AAAI 2026. See docs/methods/fedbcs.md.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from pydantic import Field, PositiveFloat, PositiveInt, model_validator
from torch import nn

from fedseg.errors import ConfigError
from fedseg.methods.aggregate import weighted_average
from fedseg.methods.balanced import sample_indices
from fedseg.methods.base import (
    ClientContext,
    ClientResult,
    FederationSpec,
    Method,
    Payload,
    ServerContext,
    ServerResult,
    State,
    Template,
    TensorSpec,
    batches_per_epoch,
)
from fedseg.methods.finch import finch_clusters
from fedseg.methods.prototypes import (
    PrototypeAccumulator,
    class_onehot,
    prototype_spec,
    prototype_tensors,
    read_prototypes,
)
from fedseg.methods.registry import register_method
from fedseg.methods.training import segmentation_loss, train_steps
from fedseg.methods.variants import Variant, VariantConfig
from fedseg.models.fsr import FSR, FSRGate
from fedseg.models.layers import conv, resize_nearest
from fedseg.models.registry import ModelConfig
from fedseg.models.unet import UNet, UNetOutput

__all__ = ["FedBCS", "FedBCSNet", "FusedEmbedding", "consistency_loss", "contrastive_loss"]

log = logging.getLogger(__name__)

Branch = Literal["enc", "dec"]

AUTHORS = Variant(
    method={
        "fsr_gate": "learned",
        "fsr_temperature": 0.1,
        "contra_weight": 1.0,
        "consis_weight": 1.0,
        "consis_form": "mse",
        "pull": "foreground",
        "prototype_mode": "batch_mean",
        "aggregation": "samples",
    },
    train={
        "batch_size": 6,
        "local_epochs": 1,
        "momentum": 0.0,
        "weight_decay": 1e-4,
        "lr_schedule": "constant",
        "keep_optimizer_state": True,
        "loss": "ce_dice",
    },
)
"""``variant: authors``: zxy1234321/FedBCS at f2034353, its defects excepted (its clamped
L_contra among them: ``clamp`` stays the config's); the table with the source of each setting
is in docs/methods/fedbcs.md."""


def _widths(net: UNet) -> list[int]:
    return [block[0].out_channels for block in net.encoder.blocks]


class FedBCSNet(nn.Module):
    """A UNet (with FSR in its encoder, if any) plus the CDPA fusion convolutions of the
    chosen ``branches``.

    ``forward`` is the UNet's; :meth:`embed` also returns the fused pixel embeddings of the
    encoder branch (at enc1's resolution) and the decoder branch (at dec<L-2>'s resolution),
    each ``(L - 2) * fusion_dim`` channels.
    """

    def __init__(
        self,
        backbone: UNet,
        fusion_dim: int | None = None,
        branches: Sequence[Branch] = ("enc", "dec"),
    ) -> None:
        super().__init__()
        widths = _widths(backbone)
        if len(widths) < 3:
            raise ConfigError(f"fedbcs: CDPA needs a UNet with >= 3 levels, got {len(widths)}")
        levels = widths[:-1]  # enc1 .. enc<L-1> (dec1 .. dec<L-1> have the same widths)
        deep, dim = levels[-1], fusion_dim or levels[-1]
        shallow = {"enc": levels[:-1], "dec": levels[-2::-1]}  # enc1.., dec<L-2>..dec1
        self.backbone = backbone
        self.fusion = nn.ModuleDict(
            {
                b: nn.ModuleList(conv(backbone.ndim, w + deep, dim, 1) for w in shallow[b])
                for b in branches
            }
        )
        self.embed_dim = dim * (len(levels) - 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.backbone(x)

    def forward_features(self, x: torch.Tensor) -> UNetOutput:
        return self.backbone.forward_features(x)

    def embed(self, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, FusedEmbedding]]:
        """``(logits, {"enc": [B, E, *S_enc1], "dec": [B, E, *S_dec<L-2>]})`` (the chosen
        branches, as :class:`FusedEmbedding`)."""
        out = self.backbone.forward_features(x)
        enc = out.encoder[:-1]  # enc1 .. enc<L-1>; the bottleneck is not used
        dec = out.decoder  # dec<L-1> .. dec1
        maps = {"enc": (enc[:-1], enc[-1]), "dec": (dec[1:], dec[0])}
        return out.logits, {b: _fuse(*maps[b], convs) for b, convs in self.fusion.items()}


@functools.lru_cache(maxsize=64)
def _nearest_source(steps: tuple[tuple[int, ...], ...]) -> torch.Tensor:
    """For each pixel of a grid of size ``steps[-1]``, the flat index of the pixel of the
    grid ``steps[0]`` it comes from when nearest-resized through every size of ``steps``
    in turn (:func:`~fedseg.models.layers.resize_nearest`, applied to the pixels' indices)."""
    grid = torch.arange(math.prod(steps[0]), dtype=torch.float64).reshape(1, 1, *steps[0])
    for size in steps[1:]:
        grid = resize_nearest(grid, size)
    return grid.flatten().long()


@dataclass(frozen=True)
class FusedEmbedding:
    """One branch's fused pixel embedding of Eqs. 10-11, ``[B, E, *size]``, held as its parts.

    Per shallow level: ``near``, the level's half of the 1x1 convolution of
    ``cat(shallow, up(deep))`` (bias included) at the level's resolution, and ``far``, the
    deep map's half at the deep resolution (nearest upsampling repeats pixels and the
    convolution acts per pixel, so the halves add after resizing). A pixel's embedding is the
    concatenation over levels of ``near[q(p)] + far[r(p)]``, ``q`` and ``r`` being where the
    literal form's nearest resizes take pixel ``p`` from: :meth:`rows` computes it for the
    pixels a loss uses and :meth:`class_sums` sums every pixel per class, both without the
    dense map (:meth:`dense`, ``E`` channels at full resolution, which the losses never need
    whole). ``rows`` equals the dense map's pixels exactly (the same additions); class sums
    differ from summing the dense map by float summation order."""

    near: tuple[torch.Tensor, ...]
    far: tuple[torch.Tensor, ...]
    size: tuple[int, ...]

    @property
    def shape(self) -> tuple[int, ...]:
        """``(B, E, *size)`` of the dense map."""
        b, dim = self.near[0].shape[:2]
        return (b, dim * len(self.near), *self.size)

    def _sources(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per level, ``(q, r)``: for each pixel of ``size``, its flat index in the level's
        grid and in the deep grid."""
        out = []
        for n, f in zip(self.near, self.far, strict=True):
            level, deep = tuple(n.shape[2:]), tuple(f.shape[2:])
            q = _nearest_source((level, self.size))
            out.append((q, _nearest_source((deep, level, self.size))))
        return out

    def dense(self) -> torch.Tensor:
        """The literal map ``[B, E, *size]``: each level's sum resized to ``size``, concatenated."""
        parts = [
            resize_nearest(n + resize_nearest(f, n.shape[2:]), self.size)
            for n, f in zip(self.near, self.far, strict=True)
        ]
        return torch.cat(parts, 1)

    def rows(self, index: torch.Tensor) -> torch.Tensor:
        """The embeddings ``[P, E]`` of the pixels ``index`` ``[P]``, flat over ``[B, *size]``
        (pixel k is pixel ``k % N`` of image ``k // N``)."""
        n = math.prod(self.size)
        image, pixel = index // n, index % n
        parts = []
        for (q, r), near, far in zip(self._sources(), self.near, self.far, strict=True):
            at_q, at_r = q.to(index.device)[pixel], r.to(index.device)[pixel]
            parts.append(near.flatten(2)[image, :, at_q] + far.flatten(2)[image, :, at_r])
        return torch.cat(parts, 1)

    def class_sums(
        self, labels: torch.Tensor, num_classes: int, ignore_index: int = 255
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-class sums ``[K, E]`` and pixel counts ``[K]`` of the dense map under
        ``labels`` (as :func:`~fedseg.methods.prototypes.class_sums`), from each level's parts
        weighted by how many pixels of each class they reach (no gradient)."""
        near0 = self.near[0]
        dtype = torch.promote_types(near0.dtype, torch.float32)
        onehot, counts = class_onehot(
            labels.to(near0.device), self.size, num_classes, ignore_index, dtype
        )
        sums = []
        with torch.no_grad(), torch.autocast(near0.device.type, enabled=False):
            for (q, r), near, far in zip(self._sources(), self.near, self.far, strict=True):
                sums.append(_reached_sums(near, q, onehot) + _reached_sums(far, r, onehot))
        return torch.cat(sums, 1), counts


def _reached_sums(grid: torch.Tensor, source: torch.Tensor, onehot: torch.Tensor) -> torch.Tensor:
    """Class sums ``[K, D]`` of ``grid`` ``[B, D, *S]``, each of its pixels weighted by the
    pixels of each class (``onehot`` ``[B, N, K]``) that take their value from it
    (``source`` ``[N]``: the index in ``grid`` of each of the N pixels)."""
    flat = grid.flatten(2).to(onehot.dtype)
    weight = onehot.new_zeros(flat.shape[0], flat.shape[2], onehot.shape[2])
    weight.index_add_(1, source.to(onehot.device), onehot)
    return torch.bmm(flat, weight).sum(0).T


def _fuse(
    shallow: Sequence[torch.Tensor], deep: torch.Tensor, convs: nn.ModuleList
) -> FusedEmbedding:
    """Eqs. 10-11: concat(shallow, nearest-upsampled deep) -> 1x1 conv, per shallow level;
    the results nearest-resized to the first shallow level's size and concatenated, held
    as :class:`FusedEmbedding` (each convolution split into its shallow and deep halves, the
    deep half at the deep map's resolution; tested against the concatenated form)."""
    conv_nd = F.conv2d if deep.dim() == 4 else F.conv3d
    near, far = [], []
    for s, fuse in zip(shallow, convs, strict=True):
        w = s.shape[1]
        near.append(conv_nd(s, fuse.weight[:, :w], fuse.bias))
        far.append(conv_nd(deep, fuse.weight[:, w:]))
    return FusedEmbedding(tuple(near), tuple(far), tuple(shallow[0].shape[2:]))


class _Embedding(nn.Module):
    """Training view of a :class:`FedBCSNet`: ``forward`` returns :meth:`FedBCSNet.embed`
    (``net`` names the network whose parameter names key the optimiser state)."""

    def __init__(self, net: FedBCSNet) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, FusedEmbedding]]:
        return self.net.embed(x)


def contrastive_loss(
    features: torch.Tensor,
    centres: torch.Tensor,
    positive: torch.Tensor,
    tau: float,
    clamp: bool = False,
) -> torch.Tensor:
    """Eq. 15, mean over ``features`` ``[N, D]``: -log(sum_pos e^{cos/tau} / sum_all
    e^{cos/tau}) over ``centres`` ``[M, D]`` (``positive``: bool ``[M]``), computed with
    log-sum-exp (stable at any ``tau``).

    ``clamp`` reproduces the authors' code instead: logits capped at 20, exponentials at 1e6,
    +1e-9. At ``tau = 0.005`` a centre whose cosine exceeds ~0.069 then sits on the cap and
    passes no gradient; when every centre does, the loss is the constant log(M / M_pos)."""
    sim = F.normalize(features, dim=1) @ F.normalize(centres, dim=1).T / tau
    if clamp:
        e = sim.clamp(max=20.0).exp().clamp(max=1e6)
        return -torch.log((e[:, positive].sum(1) + 1e-9) / (e.sum(1) + 1e-9)).mean()
    return (torch.logsumexp(sim, 1) - torch.logsumexp(sim[:, positive], 1)).mean()


ConsisForm = Literal["sum", "mse"]


def consistency_loss(
    features: torch.Tensor, centres: torch.Tensor, form: ConsisForm = "mse"
) -> torch.Tensor:
    """Eq. 16 for one branch: the squared difference between ``features`` ``[N, D]`` and the
    mean of the class's cluster centres ``[M_c, D]`` (Eq. 14), averaged over N x D as the
    authors' code does (``mse``, ``nn.MSELoss``) or summed over the D dimensions and averaged
    over the N pixels as Eq. 16 is printed (``sum``, D times larger)."""
    diff = (features - centres.mean(0)).pow(2)
    return diff.mean() if form == "mse" else diff.sum(1).mean()


@register_method("fedbcs")
class FedBCS(Method):
    """FedAvg + FSR in the encoder + dual-level (encoder/decoder) prototype alignment with
    FINCH cluster centres. ``fsr`` / ``cdpa`` switch the two components (Table 2)."""

    class Config(VariantConfig):
        """FedBCS settings; defaults are the paper's / the authors' code's."""

        variant: Literal["paper", "authors"] = "paper"
        """``paper``: the settings below as given; ``authors``: the behaviour of the
        authors' code (docs/methods/fedbcs.md, "variant: authors"), which a conflicting
        setting may not override."""
        variants: ClassVar[Mapping[str, Variant]] = {"authors": AUTHORS}

        fsr: bool = True
        """Frequency-domain style recalibration in the encoder (Table 2 column FSR)."""
        cdpa: bool = True
        """Dual-level prototypes, FINCH and the L_MP loss (Table 2 column CDPA); without it
        no prototype travels and the method is FedAvg (+ FSR)."""
        fsr_levels: tuple[PositiveInt, ...] | None = None
        """Encoder levels (1 = full resolution) followed by FSR; default 2 .. L-1
        (enc2, enc3, enc4 of the 5-level UNet, as the code)."""
        fsr_gate: FSRGate = "learned"
        """``learned`` (code: softmax(h / T), one pair per module) or ``gap`` (Eq. 6)."""
        fsr_temperature: PositiveFloat = 0.1
        """T of the ``learned`` gate."""
        branches: tuple[Branch, ...] = ("enc", "dec")
        """Prototype branches uploaded and aligned: 2 prototypes per class each (Table 3:
        4 per client on binary tasks); ``[enc]`` keeps only the encoder branch."""
        fusion_dim: PositiveInt | None = None
        """Channels of each fused level (default: the deepest encoder level's, 256 on
        harmofl_unet, giving 768-d embeddings)."""
        tau: PositiveFloat = 0.005
        """InfoNCE temperature (paper: 0.005 nuclei, 0.4 prostate; code default 0.005)."""
        contra_weight: float = Field(1.0, ge=0)
        """Weight of L_contra (paper: 1)."""
        consis_weight: float = Field(1.0, ge=0)
        """Weight of L_consis (paper: 1)."""
        clamp: bool = False
        """L_contra with the authors' caps (logits <= 20, exponentials <= 1e6): at
        ``tau = 0.005`` every centre whose cosine exceeds ~0.069 then passes no gradient
        (the term is constant once all do), a defect of the code that ``variant: authors``
        does not reproduce. Default: the exact InfoNCE by log-sum-exp."""
        consis_form: ConsisForm = "mse"
        """L_consis scale: the code's ``mse`` (mean over the embedding dimensions, branches
        averaged), under which the paper's numbers were produced, or Eq. 16 as printed
        (``sum`` over dimensions and over the two branches; 768 x 2 times larger on HarmoFL's
        UNet, it swamps the segmentation loss: docs/methods/fedbcs.md)."""
        pull: Literal["foreground", "all"] = "foreground"
        """Pixels that carry L_MP: foreground classes only (code; background prototypes are
        negatives only) or every class."""
        max_pixels: PositiveInt | None = None
        """Cap on pixels per class per batch in L_MP (random subset; default: all)."""
        prototype_mode: Literal["batch_mean", "pixel"] = "batch_mean"
        """Local prototype: mean of per-batch class means (code) or of all pixels."""
        aggregation: Literal["samples", "uniform"] = "samples"
        """Weight averaging: by sample count (supplement Eq. 27) or uniform."""

        @model_validator(mode="after")
        def _check(self) -> FedBCS.Config:
            if self.cdpa and not self.branches:
                raise ValueError("branches must name at least one of enc, dec")
            if len(set(self.branches)) != len(self.branches):
                raise ValueError(f"branches must not repeat, got {list(self.branches)}")
            return self

    config: Config
    summary = "FedBCS: FSR in the encoder + dual-level FINCH prototypes (L_contra + L_consis)"
    bf16_auto = False
    """float32 under ``engine.amp: auto``: over 3 seeds on nuclei bf16 moved FedBCS by
    +0.37 ± 0.42 DSC, more than its float32 seed SD of 0.12 (docs/benchmarks_speed.md)."""

    def __init__(
        self, config: Config, spec: FederationSpec, model: ModelConfig | None = None
    ) -> None:
        super().__init__(config, spec, model)
        if not config.fsr and not config.cdpa:
            log.warning("fedbcs with fsr and cdpa off is FedAvg (Table 2, first row)")

    # -- network and templates ---------------------------------------------------------------
    def build_model(self) -> nn.Module:
        s, cfg = self.spec, self.config
        net = self.model_cfg.build(s.in_channels, s.num_classes, s.ndim)
        if not isinstance(net, UNet):
            raise ConfigError(
                f"fedbcs inserts FSR into a UNet encoder; model.name must be unet or "
                f"harmofl_unet, got {self.model_cfg.name!r}"
            )
        widths = _widths(net)
        if cfg.fsr:
            levels = cfg.fsr_levels or tuple(range(2, len(widths)))
            bad = [k for k in levels if k > len(widths)]
            if bad:
                raise ConfigError(
                    f"method.fsr_levels: the model has encoder levels 1..{len(widths)}, got {bad}"
                )
            for k in levels:
                net.encoder.post[f"enc{k}"] = FSR(widths[k - 1], cfg.fsr_gate, cfg.fsr_temperature)
        return FedBCSNet(net, cfg.fusion_dim, cfg.branches) if cfg.cdpa else net

    def _dim(self, model: nn.Module) -> int:
        return model.embed_dim if isinstance(model, FedBCSNet) else 0

    def _branches(self) -> tuple[Branch, ...]:
        return self.config.branches if self.config.cdpa else ()

    def upload_template(self, model: nn.Module) -> Template:
        k, d = self.spec.num_classes, self._dim(model)
        out = super().upload_template(model)
        for b in self._branches():
            out |= prototype_spec(f"protos.{b}", k, d)
        return out

    def download_template(self, model: nn.Module) -> Template:
        d = self._dim(model)
        out = super().download_template(model)
        for b in self._branches():
            out[f"centres.{b}"] = TensorSpec((None, d), torch.float32)
            out[f"centres.{b}.class"] = TensorSpec((None,), torch.int64)
        return out

    def init_server(self, model: nn.Module) -> ServerResult:
        out = super().init_server(model)
        weights = next(iter(out.payloads.values())).tensors
        payload = Payload({**weights, **self._empty_centres(model)})
        return ServerResult(dict.fromkeys(out.payloads, payload), {})

    def _empty_centres(self, model: nn.Module) -> dict[str, torch.Tensor]:
        d = self._dim(model)
        out = {}
        for b in self._branches():
            out[f"centres.{b}"] = torch.zeros(0, d)
            out[f"centres.{b}.class"] = torch.zeros(0, dtype=torch.long)
        return out

    # -- client ------------------------------------------------------------------------------
    def client_step(self, payload: Payload, state: State, ctx: ClientContext) -> ClientResult:
        model = ctx.model
        self.load(model, payload, state)
        if not self.config.cdpa:
            metrics = train_steps(model, ctx)
            upload, private = self.split(model)
            return ClientResult(Payload(upload, num_examples=ctx.site.num_train), private, metrics)
        if not isinstance(model, FedBCSNet):
            raise ConfigError(f"fedbcs: expected a FedBCSNet, got {type(model).__name__}")
        centres = {
            b: (
                payload.tensors[f"centres.{b}"].to(ctx.device),
                payload.tensors[f"centres.{b}.class"].to(ctx.device),
            )
            for b in self._branches()
        }
        protos, metrics = self._train(model, centres, ctx)
        upload, private = self.split(model)
        sent = 0
        for b, acc in protos.items():
            mean, count = acc.result()
            upload |= prototype_tensors(f"protos.{b}", mean, count)
            sent += int((count > 0).sum())
        metrics["prototypes"] = float(sent)
        return ClientResult(Payload(upload, num_examples=ctx.site.num_train), private, metrics)

    def _train(
        self,
        model: FedBCSNet,
        centres: Mapping[str, tuple[torch.Tensor, torch.Tensor]],
        ctx: ClientContext,
    ) -> tuple[dict[str, PrototypeAccumulator], dict[str, float]]:
        """Local training with L_MP; prototypes of the last local epoch's batches."""
        spec, cfg = ctx.spec, self.config
        steps = ctx.steps()
        first = steps - min(steps, batches_per_epoch(ctx.site.num_train, ctx.train.batch_size))
        accs = {
            b: PrototypeAccumulator(spec.num_classes, spec.ignore_index, cfg.prototype_mode)
            for b in self._branches()
        }
        seg = segmentation_loss(ctx)
        step = [0]
        sums = {"l_contra": 0.0, "l_consis": 0.0}

        def loss(
            out: tuple[torch.Tensor, dict[str, FusedEmbedding]], y: torch.Tensor
        ) -> torch.Tensor:
            logits, emb = out
            if step[0] >= first:
                for b, acc in accs.items():
                    acc.add_sums(*emb[b].class_sums(y, spec.num_classes, spec.ignore_index))
            step[0] += 1
            contra, consis = self.mp_terms(emb, y, centres, ctx)
            sums["l_contra"] += float(contra.detach())
            sums["l_consis"] += float(consis.detach())
            return seg(logits, y) + cfg.contra_weight * contra + cfg.consis_weight * consis

        metrics = train_steps(_Embedding(model), ctx, loss)  # type: ignore[arg-type]
        metrics |= {k: v / max(steps, 1) for k, v in sums.items()}
        return accs, metrics

    def mp_terms(
        self,
        embeddings: Mapping[str, FusedEmbedding],
        labels: torch.Tensor,
        centres: Mapping[str, tuple[torch.Tensor, torch.Tensor]],
        ctx: ClientContext,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(L_contra, L_consis)`` of one batch: per branch the mean over the pulled classes
        present in the batch that have centres, then averaged over the branches (L_consis
        summed over them with ``consis_form: sum``, as Eq. 16). Both are 0 without centres,
        e.g. in round 1."""
        cfg, spec = self.config, ctx.spec
        consis_div = 1 if cfg.consis_form == "sum" else len(centres)
        zero = next(iter(embeddings.values())).near[0].new_zeros(())
        contra, consis = zero, zero
        for b, (cents, cls) in centres.items():
            if len(cents) == 0:
                continue
            emb = embeddings[b]
            cap = cfg.max_pixels or emb.shape[0] * math.prod(emb.size)  # default: all
            idx, y = sample_indices(labels, emb.size, spec.num_classes, cap, ctx.generator)
            first = 1 if cfg.pull == "foreground" else 0
            classes = [c for c in range(first, spec.num_classes) if (cls == c).any()]
            pulled = torch.isin(y, torch.tensor(classes, dtype=y.dtype))
            f, y = emb.rows(idx[pulled].to(cls.device)), y[pulled].to(cls.device)
            terms = []
            for c in classes:
                fc = f[y == c]
                if len(fc) == 0:
                    continue
                pos = cls == c
                terms.append(
                    (
                        contrastive_loss(fc, cents, pos, cfg.tau, cfg.clamp),
                        consistency_loss(fc, cents[pos], cfg.consis_form),
                    )
                )
            if terms:
                contra = contra + torch.stack([t[0] for t in terms]).mean() / len(centres)
                consis = consis + torch.stack([t[1] for t in terms]).mean() / consis_div
        return contra, consis

    # -- server ------------------------------------------------------------------------------
    def server_step(
        self, uploads: Mapping[str, Payload], state: State, ctx: ServerContext
    ) -> ServerResult:
        first = next(iter(uploads.values()))
        keys = [k for k in first.tensors if not k.startswith("protos.")]
        weights = None
        if self.config.aggregation == "uniform":
            weights = dict.fromkeys(uploads, 1.0 / len(uploads))
        payload = weighted_average(uploads, weights, keys)
        clusters: dict[str, list[int]] = {}
        for b in self._branches():
            cents, cls, sizes = self.cluster({s: u.tensors for s, u in uploads.items()}, b)
            payload[f"centres.{b}"], payload[f"centres.{b}.class"] = cents, cls
            clusters[b] = sizes
        shared = Payload(payload)
        metrics = {"clusters": clusters} if clusters else {}
        return ServerResult(dict.fromkeys(ctx.spec.site_names, shared), state, metrics)

    def cluster(
        self, uploads: Mapping[str, Mapping[str, torch.Tensor]], branch: str
    ) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """FINCH per class over the sites' ``branch`` prototypes (sites that saw the class):
        ``(centres [M, D], class of each centre [M], clusters per class)``."""
        sets = [read_prototypes(t, f"protos.{branch}") for t in uploads.values()]
        dim = sets[0][0].shape[1]
        cents, cls, sizes = [], [], []
        for c in range(self.spec.num_classes):
            vecs = [p[c] for p, n in sets if n[c] > 0]
            if not vecs:
                sizes.append(0)
                continue
            _, centroids = finch_clusters(torch.stack(vecs))
            cents.append(centroids)
            cls.append(torch.full((len(centroids),), c, dtype=torch.long))
            sizes.append(len(centroids))
        if not cents:
            return torch.zeros(0, dim), torch.zeros(0, dtype=torch.long), sizes
        return torch.cat(cents), torch.cat(cls), sizes
