"""FedLPPA (Lin et al., IEEE TMI 2024): learnable prompts and aggregation for federated
weakly-supervised segmentation with heterogeneous sparse labels.

Global (FedAvg by sample count, Eq. 2): encoder and TDF incl. the UKP and DDP prompts.
Personal: the main decoder + MLP (phi) and the auxiliary decoder (phi-bar). The server also
averages the main decoders into phi_G and builds each site's auxiliary decoder from the
uploaded main decoders (Eqs. 7-9 or another ``aux_strategy``). A site merges what it receives
with its own decoders by Learnable Aggregation (Eqs. 10-13, :mod:`fedseg.methods.ala`) and
trains with the dual-decoder WSS loss (Eqs. 14-17, :mod:`fedseg.methods.pseudo_label`).
Decisions the paper leaves open are listed in ``docs/methods/fedlppa.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

import torch
from pydantic import Field, model_validator
from torch import nn

from fedseg.errors import ConfigError
from fedseg.methods.aggregate import RunningAverage, mix_states
from fedseg.methods.ala import init_weights, merge, train_weights
from fedseg.methods.base import (
    Aggregator,
    ClientContext,
    ClientResult,
    FederationSpec,
    Method,
    MethodConfig,
    Payload,
    ServerContext,
    ServerResult,
    SiteSpec,
    State,
    aggregate,
    batches_per_epoch,
)
from fedseg.methods.partition import Partition, ResolvedPartition
from fedseg.methods.pseudo_label import dual_decoder_loss
from fedseg.methods.registry import register_method
from fedseg.methods.training import LossFn, segmentation_loss, train_steps
from fedseg.methods.variants import Variant, VariantConfig
from fedseg.models.fedlppa_net import FedLPPANet
from fedseg.models.registry import ModelConfig
from fedseg.models.tdf import Fusion, prompt_affinity

__all__ = ["FedLPPA", "FedLPPAConfig", "aux_mixing", "la_statistics"]

AuxStrategy = Literal["random", "fixed_order", "highest_similarity", "similarity_aggregated"]
MAIN, AUX = ("decoder.", "mlp."), "aux_decoder."


AUTHORS = Variant(
    method={
        "aux_source": "aux",
        "aux_include_self": True,
        "affinity_prompts": "aggregated",
        "ddp_aggregation": "fedavg",
        "restore_ddp_slots": False,
        "mix_low": 0.0,
        "mix_high": 1.0,
        "aux_pce": False,
        "la_update": "sgd",
        "la_eta": 1.0,
        "la_init": "own",
        "la_schedule": "passes",
        "la_window": 10,
        "la_tol": 0.1,
        "tdf_dropout": 0.5,
    },
    train={
        "optimizer": "adamw",
        "weight_decay": 0.01,
        "lr_schedule": "poly",
        "keep_optimizer_state": False,
    },
    defaults={"la_skip_rounds": 50},
)
"""``variant: authors`` (the default): llmir/FedLPPA at 6594e1a (``--strategy FedUniV2.1``),
its defects excepted; the table with the source of each setting is in
docs/methods/fedlppa.md. The LA warm-up, a number of rounds, is filled in where the config
gives none."""


class FedLPPAConfig(VariantConfig):
    """FedLPPA settings; the switches reproduce the paper's ablations (Tables VII-VIII,
    Figs. 8-9)."""

    variant: Literal["authors", "paper"] = "authors"
    """``authors`` (default): the behaviour of the authors' code (docs/methods/fedlppa.md,
    "variant: authors"), which a conflicting setting may not override; ``paper``: the
    settings below as given, whose defaults are fedseg's reading of the paper's text."""
    variants: ClassVar[Mapping[str, Variant]] = {"authors": AUTHORS}

    tdf: bool = True
    """Tri-prompt dual-attention fusion + MLP block (off: plain UNet bottleneck)."""
    pd: bool = True
    """Prompt-driven dual decoder: server-built auxiliary decoder + pseudo-label loss."""
    la: bool = True
    """Learnable aggregation of both decoders (off: decoders = what the server sent)."""
    prompts: tuple[Literal["ddp", "ukp", "asp"], ...] = ("ddp", "ukp", "asp")
    """Prompts fed to the TDF; DDP is always required."""
    fusion: Fusion = "dual"
    """Feature enhancement after the fusion convs: none, channel, spatial or dual (Eq. 5)."""
    aux_strategy: AuxStrategy = "similarity_aggregated"
    """How the server builds a site's auxiliary decoder from the uploaded main decoders."""
    affinity_prompts: Literal["uploaded", "aggregated"] = "uploaded"
    """DDP slots Eq. 7 compares: ``uploaded``, each site's own slot as the site uploaded it
    (Sec. III-C: the server extracts the DDPs from the clients' local prompts), with the
    averaged UKP; ``aggregated``, the slots after aggregation (the authors' code)."""
    ddp_aggregation: Literal["fedavg", "owner"] = "fedavg"
    """Slot i of the aggregated DDP: ``fedavg``, the sample-weighted average of every upload
    (Eq. 2; only site i trains slot i, so its update is scaled by n_i / n); ``owner``, site
    i's uploaded slot (the average over the sites that trained it)."""
    aux_source: Literal["main", "aux"] = "main"
    """What the server mixes into site i's aux decoder (Eq. 9): ``main``, the uploaded main
    decoders without their MLP (the paper: Eq. 9 sums the main decoders phi_j, and the aux
    decoder is never uploaded, 2.2564M per round); ``aux``, the uploaded aux decoders (the
    authors' code, which uploads the whole model). See docs/methods/fedlppa.md."""
    aux_include_self: bool = True
    """similarity_aggregated: include a_ii = 1 (Eq. 9 sums over all j)."""
    restore_ddp_slots: bool = True
    """After local training, set the DDP slots other than the site's own back to the
    downloaded values (they get no gradient; only weight decay would move them); ``false``
    uploads them as the optimiser left them (the authors' code)."""
    lam: float = Field(0.5, ge=0)
    """Weight of the pseudo-label Dice term (Eq. 15)."""
    mix_low: float = Field(0.7, ge=0, le=1)
    """Lower bound of lambda_m ~ U(mix_low, mix_high) (Eq. 14)."""
    mix_high: float = Field(1.0, ge=0, le=1)
    """Upper bound of lambda_m."""
    aux_pce: bool = True
    """Supervised term: ``(pCE_main + pCE_aux) / 2`` (Eq. 16); ``false``: pCE of the main
    decoder only (the authors' code; the aux decoder then learns from the pseudo labels)."""
    la_update: Literal["adam", "sgd"] = "adam"
    """How the aggregation weights step (Eqs. 12-13): ``adam``, the optimiser the paper uses
    for its learnable parameters (Sec. IV-B), or ``sgd``, the literal plain step of Eq. 12
    (FedALA's and the authors' code)."""
    la_eta: float | None = Field(None, ge=0)
    """Learning rate of the aggregation weights; ``None`` follows the rule of
    docs/methods/fedlppa.md: the round's ``train`` learning rate (schedule included) with
    ``adam``, 1.0 (FedALA's value) with ``sgd``."""
    la_init: Literal["received", "own"] = "received"
    """Initial LA weights: all ones, the merge starts at the received decoders (Eqs. 10-11);
    ``own``: all zeros, it starts at the site's own decoders (the authors' code, whose
    all-ones weights multiply the site's difference from the received decoders)."""
    la_schedule: Literal["steps", "passes"] = "steps"
    """``steps``: the first LA runs until its loss settles (at most ``la_max_iters``
    steps), later ones ``la_iters`` steps; ``passes`` (the authors' and FedALA's code): every
    LA is one pass over the site's training batches, the first one passes until the loss of
    a pass settles (at most ``la_max_iters`` passes)."""
    la_skip_rounds: int = Field(0, ge=0)
    """Rounds at the start in which no LA runs (the received decoders are used as they
    are); the authors' code skips LA while its server round ``iter_global`` is at most 50
    (``variant: authors`` fills 50 where the config gives none). Past it the site trains from
    the LA merge (``la_merge: train``, the paper), which with the code's other LA settings
    keeps each site's own decoders; ``la_merge: eval`` is the code's use
    (docs/methods/fedlppa.md)."""
    la_merge: Literal["train", "eval"] = "train"
    """What the LA merge is used for: ``train``, the site trains its round from the merged
    decoders (Alg. 1) and evaluates them; ``eval``, the site trains from the received
    decoders and the merge is its evaluation model only (what the authors' code does, by a
    defect: the next load overwrites the merge; docs/methods/fedlppa.md)."""
    la_iters: int = Field(2, ge=0)
    """Weight-training steps per round after the first (settling) LA (``la_schedule:
    steps``)."""
    la_max_iters: int = Field(50, ge=1)
    """Cap on the first LA, which runs until the loss settles: steps, or passes with
    ``la_schedule: passes``."""
    la_window: int = Field(10, ge=1)
    """Settling test: number of recent LA losses compared."""
    la_tol: float = Field(0.1, gt=0)
    """Settling test: their standard deviation must fall below this."""
    tdf_dropout: float = Field(0.5, ge=0, lt=1)
    """Dropout after the first TDF fusion conv block."""
    log_matrices_up_to: int = Field(100, ge=0)
    """Server metrics carry the N x N ``affinity`` and ``aux_weights`` matrices while the
    federation has at most this many sites; above it only their summaries (at 1000 sites the
    two matrices are 43 MB of JSON per round in ``rounds.jsonl``)."""

    @model_validator(mode="after")
    def _check(self) -> FedLPPAConfig:
        if "ddp" not in self.prompts or len(set(self.prompts)) != len(self.prompts):
            raise ValueError(f"prompts must contain 'ddp' once, got {list(self.prompts)}")
        if self.la_update == "adam" and self.la_eta is not None and self.la_eta > 0.1:
            raise ValueError(
                f"la_eta {self.la_eta} with la_update adam moves every LA weight (in [0, 1]) by "
                "up to la_eta per step; 1.0 is the plain-gradient value of FedALA: use "
                "la_update: sgd for it, or la_eta: null for the paper's learning rate"
            )
        if self.mix_low > self.mix_high:
            raise ValueError(f"mix_low must be <= mix_high, got {self.mix_low} > {self.mix_high}")
        if self.pd and not self.tdf and "similarity" in self.aux_strategy:
            raise ValueError(
                f"aux_strategy {self.aux_strategy!r} compares prompts and needs tdf: true; "
                "use random or fixed_order without the TDF"
            )
        return self


def la_statistics(
    prev: Mapping[str, torch.Tensor],
    glob: Mapping[str, torch.Tensor],
    weights: Mapping[str, torch.Tensor],
) -> dict[str, float]:
    """Per decoder (``main``: decoder + MLP, ``aux``): the mean and minimum LA weight and
    ``local_share``, how much of the site's own difference from what the server sent the
    merge keeps, ``||(prev - glob) * (1 - W)|| / ||prev - glob||`` (0: the server's decoder,
    1: the site's own)."""
    out = {}
    for name, prefixes in (("main", MAIN), ("aux", (AUX,))):
        keys = [k for k in weights if k.startswith(prefixes)]
        if not keys:
            continue
        w = torch.cat([weights[k].float().flatten() for k in keys])
        d = torch.cat([(prev[k].to(w.device) - glob[k].to(w.device)).flatten() for k in keys])
        share = float((d * (1 - w)).norm() / d.norm()) if d.norm() > 0 else 0.0
        out |= {
            f"la_{name}_mean": float(w.mean()),
            f"la_{name}_min": float(w.min()),
            f"la_{name}_local_share": share,
        }
    return out


def _derangement(n: int, gen: torch.Generator) -> list[int]:
    """A random permutation of ``range(n)`` without fixed points (``n >= 2``)."""
    while True:
        perm = torch.randperm(n, generator=gen).tolist()
        if all(p != i for i, p in enumerate(perm)):
            return perm


def aux_mixing(
    strategy: AuxStrategy,
    affinity: torch.Tensor | None,
    uploaded: list[int],
    num_sites: int,
    gen: torch.Generator,
    include_self: bool = True,
) -> torch.Tensor:
    """``[N, N]`` weights: row i mixes the uploaded main decoders into site i's aux decoder.

    Columns of sites that did not upload are zero; every row sums to 1. ``random`` deals the
    uploaded decoders out as a derangement (sites that did not upload draw one uniformly);
    ``fixed_order`` gives site i the decoder of the nearest uploaded predecessor in cyclic
    order; ``highest_similarity`` the most similar other site; ``similarity_aggregated``
    the affinity-weighted average (Eq. 9). A lone uploader gets its own decoder back.
    """
    mix = torch.zeros(num_sites, num_sites)
    if not uploaded:
        raise ConfigError("aux_mixing needs at least one uploaded decoder")
    if affinity is None and strategy in ("highest_similarity", "similarity_aggregated"):
        raise ConfigError(f"aux_strategy {strategy!r} needs the prompt affinity (tdf: true)")
    if strategy == "random" and len(uploaded) > 1:
        for i, p in zip(uploaded, _derangement(len(uploaded), gen), strict=True):
            mix[i, uploaded[p]] = 1.0
    for i in range(num_sites):
        others = [j for j in uploaded if j != i] or [i]
        if strategy == "random" and mix[i].sum() == 0:
            mix[i, others[int(torch.randint(len(others), (1,), generator=gen))]] = 1.0
        elif strategy == "fixed_order":
            predecessors = [(i - d) % num_sites for d in range(1, num_sites + 1)]
            mix[i, next(j for j in predecessors if j in others)] = 1.0
        elif strategy == "highest_similarity" and affinity is not None:
            mix[i, max(others, key=lambda j: (float(affinity[i, j]), -j))] = 1.0
        elif strategy == "similarity_aggregated" and affinity is not None:
            cand = [j for j in uploaded if include_self or j != i] or others
            row = torch.tensor([float(affinity[i, j]) for j in cand])
            row = row / row.sum() if row.sum() > 0 else torch.full((len(cand),), 1 / len(cand))
            mix[i, cand] = row
    return mix


@register_method("fedlppa")
class FedLPPA(Method):
    """Personalized prompts (TDF), prompt-similarity dual decoder (PD), learnable aggregation
    (LA). Reference: Lin et al., "FedLPPA: Learning Personalized Prompt and Aggregation for
    Federated Weakly-supervised Medical Image Segmentation", IEEE TMI 2024.
    """

    Config = FedLPPAConfig
    partition = Partition(download_only=("aux_decoder.*",))
    personalized = True
    summary = (
        "FedLPPA: global encoder + TDF prompts, personal main/aux decoders with prompt-"
        "similarity aux aggregation, learnable aggregation and dual-decoder pseudo labels"
    )

    def __init__(
        self, config: MethodConfig, spec: FederationSpec, model: ModelConfig | None = None
    ) -> None:
        if not isinstance(config, FedLPPAConfig):
            raise ConfigError(f"FedLPPA needs a FedLPPAConfig, got {type(config).__name__}")
        super().__init__(config, spec, model)
        self.cfg = config
        if config.tdf and len(spec.image_size) != spec.ndim:
            raise ConfigError(
                f"FedLPPA's prompts need the federation's image size, got {spec.image_size}"
            )

    def build_model(self) -> nn.Module:
        c, s = self.cfg, self.spec
        return FedLPPANet(
            s.in_channels,
            s.num_classes,
            image_size=s.image_size or (0,) * s.ndim,
            num_sites=len(s.sites),
            ndim=s.ndim,
            tdf=c.tdf,
            aux_decoder=c.pd,
            ukp="ukp" in c.prompts,
            asp="asp" in c.prompts,
            fusion=c.fusion,
            tdf_dropout=c.tdf_dropout,
            **self.unet_kwargs(),
        )

    def parts(self, model: nn.Module) -> ResolvedPartition:
        if self._parts is None:
            paper = self.cfg.pd and self.cfg.aux_source == "main"
            dl = self.partition.download_only if paper else ()
            self._parts = Partition(download_only=dl).resolve(model)
        return self._parts

    @property
    def aux_prefix(self) -> str:
        """Keys of the uploads the server mixes into the aux decoders (``aux_source``)."""
        return MAIN[0] if self.cfg.aux_source == "main" else AUX

    # -- helpers ---------------------------------------------------------------------------
    @staticmethod
    def _personal(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The main and auxiliary decoder entries of ``tensors`` (detached copies)."""
        return {k: v.detach().clone() for k, v in tensors.items() if k.startswith((*MAIN, AUX))}

    @staticmethod
    def _net(model: nn.Module) -> FedLPPANet:
        if not isinstance(model, FedLPPANet):
            raise ConfigError(f"FedLPPA needs its FedLPPANet, got {type(model).__name__}")
        return model

    @staticmethod
    def asp_sparsity(ctx: ClientContext) -> str | None:
        """The sparsity the site's ASP encodes: its annotation's, or ``None`` (the all-zero
        prompt of full masks) when the run trains on full masks (``data.labels: full``)."""
        return None if ctx.spec.labels == "full" else ctx.site.sparsity

    def _la_eta(self, ctx: ClientContext) -> float:
        if self.cfg.la_eta is not None:
            return self.cfg.la_eta
        return ctx.lr() if self.cfg.la_update == "adam" else 1.0

    def _la_pass(self, ctx: ClientContext) -> int:
        """LA steps per pass: one pass over the training batches with ``la_schedule:
        passes``, else 1 (each step counts for the settling test)."""
        if self.cfg.la_schedule == "steps":
            return 1
        return batches_per_epoch(ctx.site.num_train, ctx.train.batch_size)

    def _loss(self, ctx: ClientContext, log: dict[str, float]) -> LossFn:
        if not self.cfg.pd:
            return segmentation_loss(ctx)
        c, spec = self.cfg, ctx.spec

        def loss(out: Any, labels: torch.Tensor) -> torch.Tensor:
            value, parts = dual_decoder_loss(
                out.main,
                out.aux,
                labels,
                ignore_index=spec.ignore_index,
                num_classes=spec.num_classes,
                generator=ctx.generator,
                lam=c.lam,
                mix_low=c.mix_low,
                mix_high=c.mix_high,
                aux_pce=c.aux_pce,
            )
            for k in ("sup", "pse", "pce_main", "pce_aux", "dice_main", "dice_aux"):
                log[k] = log.get(k, 0.0) + parts[k]
            log["n"] = log.get("n", 0.0) + 1
            return value

        return loss

    # -- steps -----------------------------------------------------------------------------
    def init_client(self, model: nn.Module, site: SiteSpec) -> State:
        if not self.cfg.la:
            return {}
        dec = self._personal(model.state_dict())
        keys = [k for k, p in model.named_parameters() if k in dec and p.requires_grad]
        weights = init_weights(dec, keys)
        if self.cfg.la_init == "own":
            weights = {k: torch.zeros_like(w) for k, w in weights.items()}
        return {"decoders": dec, "la": weights, "la_started": False}

    def client_step(self, payload: Payload, state: State, ctx: ClientContext) -> ClientResult:
        c, model, site = self.cfg, self._net(ctx.model), ctx.site
        model.load_state_dict(payload.tensors)
        model.set_site(site.index, self.asp_sparsity(ctx))
        log: dict[str, float] = {}
        loss = self._loss(ctx, log)
        metrics: dict[str, float] = {}
        new_state: State = {}
        if c.la and ctx.round < c.la_skip_rounds:
            new_state = dict(state)
        elif c.la:
            first = not state["la_started"]
            per_pass = self._la_pass(ctx)
            res = train_weights(
                model,
                state["decoders"],
                self._personal(payload.tensors),
                state["la"],
                ctx.batches,
                lambda m, x, y: loss(m(x), y),
                eta=self._la_eta(ctx),
                steps=per_pass if c.la_schedule == "passes" else c.la_iters,
                settle=first,
                max_steps=c.la_max_iters * per_pass,
                window=c.la_window,
                tol=c.la_tol,
                pass_steps=per_pass,
                update=c.la_update,
            )
            metrics |= {"la_steps": float(res.steps), "la_eta": self._la_eta(ctx)}
            metrics |= la_statistics(state["decoders"], payload.tensors, res.weights)
            new_state = {"la": res.weights, "la_started": not first or not res.skipped}
            log.clear()
            if c.la_merge == "eval":
                model.load_state_dict(payload.tensors)
        metrics |= train_steps(model, ctx, loss_fn=loss)
        metrics |= {k: v / log["n"] for k, v in log.items() if k != "n"}
        if c.restore_ddp_slots:
            self._keep_other_ddp_slots(model, payload, site.index)
        sd = model.state_dict()
        parts = self.parts(model)
        if c.la:
            new_state["decoders"] = self._personal(sd)
        upload = Payload(parts.take(sd, parts.upload), num_examples=site.num_train)
        return ClientResult(upload, new_state, metrics)

    @staticmethod
    def _keep_other_ddp_slots(model: FedLPPANet, payload: Payload, own: int) -> None:
        """Only slot ``own`` of the DDP is this site's; undo weight decay on the others."""
        if model.tdf is None:
            return
        ddp = model.tdf.ddp
        with torch.no_grad():
            mine = ddp[own].clone()
            ddp.copy_(payload.tensors["tdf.ddp"])
            ddp[own] = mine

    @staticmethod
    def _own_ddp_slots(
        slots: Mapping[str, torch.Tensor], averaged: torch.Tensor, spec: FederationSpec
    ) -> torch.Tensor:
        """The DDP with slot i as site i uploaded it (the average where site i did not)."""
        ddp = averaged.clone()
        for site in spec.sites:
            if site.name in slots:
                ddp[site.index] = slots[site.name]
        return ddp

    def aggregator(self, state: State, ctx: ServerContext) -> Aggregator:
        """A running sample-weighted average of the uploads; of each upload only the site's
        own DDP slot and (with PD) its main decoder are kept until the round closes."""
        return _RoundAggregate(self, state, ctx)

    def server_step(
        self, uploads: Mapping[str, Payload], state: State, ctx: ServerContext
    ) -> ServerResult:
        return aggregate(self.aggregator(state, ctx), uploads)

    def close_round(
        self,
        glob: dict[str, torch.Tensor],
        decoders: Mapping[str, Mapping[str, torch.Tensor]],
        slots: Mapping[str, torch.Tensor],
        state: State,
        ctx: ServerContext,
    ) -> ServerResult:
        """Eqs. 2 and 7-9 from the averaged uploads ``glob``, the uploaders' own DDP
        ``slots`` and their main ``decoders``."""
        names = ctx.spec.site_names
        matrices = len(names) <= self.cfg.log_matrices_up_to
        metrics: dict[str, Any] = {}
        aff = None
        if self.cfg.tdf:
            own = self._own_ddp_slots(slots, glob["tdf.ddp"], ctx.spec)
            if self.cfg.ddp_aggregation == "owner":
                glob["tdf.ddp"] = own
            ddp = own if self.cfg.affinity_prompts == "uploaded" else glob["tdf.ddp"]
            order = [s.index for s in ctx.spec.sites]  # DDP slot of each site, in site order
            aff = prompt_affinity(ddp, glob.get("tdf.ukp"))[order][:, order]
            if matrices:
                metrics |= {"affinity": aff.tolist(), "affinity_sites": names}
            first, last = state.get("affinity_first", aff), state.get("affinity_last", aff)
            metrics |= {
                "affinity_change": float((aff - last).abs().max()),
                "affinity_drift": float((aff - first).abs().max()),
            }
            state = {**state, "affinity_first": first, "affinity_last": aff}
        if not self.cfg.pd:
            payload = Payload(glob)
            return ServerResult(dict.fromkeys(names, payload), state, metrics)
        uploaded = [i for i, n in enumerate(names) if n in decoders]
        mix = aux_mixing(
            self.cfg.aux_strategy,
            aff,
            uploaded,
            len(names),
            ctx.generator,
            self.cfg.aux_include_self,
        )
        if matrices:
            metrics["aux_weights"] = mix.tolist()
        metrics["aux_self_weight"] = float(mix.diagonal().mean())
        auxes = mix_states([decoders[names[j]] for j in uploaded], mix[:, uploaded])
        source = self.aux_prefix
        payloads = {
            name: Payload({**glob, **{AUX + k[len(source) :]: v for k, v in aux.items()}})
            for name, aux in zip(names, auxes, strict=True)
        }
        return ServerResult(payloads, state, metrics)

    def eval_model(self, payload: Payload, state: State, ctx: ClientContext) -> nn.Module:
        """The global encoder/TDF with the personal decoders merged by the learned weights."""
        model = self._net(ctx.model)
        model.load_state_dict(payload.tensors)
        if self.cfg.la and state.get("decoders"):
            merged = merge(state["decoders"], self._personal(payload.tensors), state["la"])
            model.load_state_dict(merged, strict=False)
        model.set_site(ctx.site.index, self.asp_sparsity(ctx))
        return model


class _RoundAggregate:
    """FedLPPA's server step as a reduction: the uploads go into a running sample-weighted
    average as they arrive; the affinity (Eq. 7) needs every uploader's own DDP slot and the
    auxiliary decoders (Eq. 9) every main decoder, so only those are kept."""

    def __init__(self, method: FedLPPA, state: State, ctx: ServerContext) -> None:
        self.method, self.state, self.ctx = method, state, ctx
        self.avg = RunningAverage()
        self.index = {s.name: s.index for s in ctx.spec.sites}
        self.slots: dict[str, torch.Tensor] = {}
        self.decoders: dict[str, dict[str, torch.Tensor]] = {}

    def add(self, site: str, upload: Payload) -> None:
        tensors, cfg = upload.tensors, self.method.cfg
        self.avg.add(tensors, float(upload.num_examples))
        if cfg.tdf:
            self.slots[site] = tensors["tdf.ddp"][self.index[site]].clone()
        if cfg.pd:
            source = self.method.aux_prefix
            self.decoders[site] = {
                k: v.detach().clone() for k, v in tensors.items() if k.startswith(source)
            }

    def finish(self) -> ServerResult:
        glob = self.avg.result()
        return self.method.close_round(glob, self.decoders, self.slots, self.state, self.ctx)
