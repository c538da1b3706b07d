"""What leaves a site each round, per method: generated from the registry and the partitions.

For every registered method the table lists the parameter groups a site uploads (state-dict
keys grouped by their first two name components; ``without BN`` marks groups whose
BatchNorm entries stay home), the trainable parameter counts of the upload, the download and
the private part (``ResolvedPartition.params()``, as in ``results.json``), and any uploaded
tensors that are not model weights (e.g. prototypes or statistics declared by
``upload_template``). Numbers are for the reference network of the given federation.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

from torch import nn

from fedseg.errors import FedsegError
from fedseg.methods import FederationSpec, SiteSpec, get_method, list_methods, modules_of_type
from fedseg.methods.base import Template

__all__ = ["PrivacyRow", "privacy_rows", "privacy_table", "reference_spec", "update_markdown"]

BN = modules_of_type(nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


def reference_spec(
    in_channels: int = 1, num_classes: int = 2, sites: int = 4, ndim: int = 2, size: int = 64
) -> FederationSpec:
    """A weakly labelled federation like FedLPPA's (one site per annotation sparsity + one
    scribble site), used only to instantiate the methods."""
    kinds = [
        ("scribble", "medium"),
        ("point", "sparse"),
        ("block", "dense"),
        ("scribble2", "medium"),
    ]
    specs = tuple(SiteSpec(f"site{i}", i, 20 + 5 * i, *kinds[i % len(kinds)]) for i in range(sites))
    return FederationSpec(in_channels, num_classes, ndim, 255, "weak", specs, (size,) * ndim)


def _group(key: str) -> str:
    parts = key.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 else parts[0]


def _groups(keys: Iterable[str], all_keys: list[str], bn: set[str], stats: set[str]) -> str:
    chosen: dict[str, set[str]] = defaultdict(set)
    for k in keys:
        chosen[_group(k)].add(k)
    total: dict[str, set[str]] = defaultdict(set)
    for k in all_keys:
        total[_group(k)].add(k)
    out = []
    for g in sorted(chosen, key=lambda g: min(all_keys.index(k) for k in chosen[g])):
        have, full = chosen[g], total[g]
        if have == full:
            out.append(g)
        elif have == full - bn:
            out.append(f"{g} (without BN)")
        elif have == full - stats:
            out.append(f"{g} (without BN statistics)")
        else:
            out.append(f"{g} ({len(have)} of {len(full)} tensors)")
    return ", ".join(out) or "nothing"


def _extras(template: Template) -> str:
    """Non-weight tensors of a template, grouped by their first name component; variable
    dimensions (e.g. a number of prototypes) are shown as such."""
    groups: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for key, spec in template.items():
        g = groups[key.split(".")[0]]
        g[0] += 1
        if any(d is None for d in spec.shape):
            g[2] += 1
        else:
            g[1] += math.prod(d for d in spec.shape if d is not None)
    return ", ".join(
        f"{g}.* ({n} tensors, {v:,} values{', some of variable size' if var else ''})"
        for g, (n, v, var) in groups.items()
    )


def _stat_buffers(model: nn.Module, keys: Iterable[str], bn: set[str]) -> list[str]:
    """Uploaded buffers other than BatchNorm statistics: they may hold data statistics
    (e.g. HarmoFL's running amplitude spectrum), so the table names them."""
    params = {n for n, _ in model.named_parameters()}
    return [k for k in keys if k not in params and k not in bn]


class PrivacyRow(dict):  # type: ignore[type-arg]
    """One method's row: ``method``, ``uploads``, ``upload``, ``download``, ``private``,
    ``extra`` (non-weight upload tensors), ``down_extra`` (non-weight tensors sent to a
    site), ``buffers`` (uploaded non-BN buffers, which may hold data statistics), ``note``."""


def privacy_rows(spec: FederationSpec | None = None, pattern: str = "*") -> list[PrivacyRow]:
    """One row per registered method (matching ``pattern``) with default settings."""
    spec = spec or reference_spec()
    rows = []
    for name in list_methods(pattern):
        cls = get_method(name)
        if cls.pooled:
            rows.append(PrivacyRow(method=name, note="pools all training data; not federated"))
            continue
        try:
            method = cls(cls.Config(), spec)
            model = method.build_model()
            parts = method.parts(model)
            template = method.upload_template(model)
        except (FedsegError, ValueError) as e:
            rows.append(PrivacyRow(method=name, note=f"cannot instantiate with defaults: {e}"))
            continue
        keys = list(model.state_dict())
        bn = set(BN(model))
        stats = bn - {n for n, _ in model.named_parameters()}
        params = parts.params()
        extra = {k: v for k, v in template.items() if k not in parts.upload}
        down_extra = {
            k: v for k, v in method.download_template(model).items() if k not in parts.download
        }
        buffers = _stat_buffers(model, parts.upload, bn)
        rows.append(
            PrivacyRow(
                method=name,
                uploads=_groups(parts.upload, keys, bn, stats),
                upload=params["upload"],
                download=params["download"],
                private=parts.count(parts.private),
                total=params["total"],
                extra=_extras(extra),
                down_extra=_extras(down_extra),
                buffers=", ".join(buffers),
                note="",
            )
        )
    return rows


def privacy_table(spec: FederationSpec | None = None, pattern: str = "*") -> str:
    """Markdown table of :func:`privacy_rows`."""
    spec = spec or reference_spec()
    head = (
        "| Method | Weights a site uploads each round | Upload | Download | Private | "
        "Other uploaded tensors | Other tensors sent to a site | Uploaded non-BN buffers |"
        "\n|---|---|---:|---:|---:|---|---|---|"
    )
    lines = [head]
    for row in privacy_rows(spec, pattern):
        if "uploads" not in row:
            lines.append(f"| {row['method']} | {row['note']} | | | | | | |")
            continue
        lines.append(
            f"| {row['method']} | {row['uploads']} | {row['upload']:,} | {row['download']:,} | "
            f"{row['private']:,} | {row['extra'] or '-'} | {row['down_extra'] or '-'} | "
            f"{row['buffers'] or '-'} |"
        )
    ch, k, n = spec.in_channels, spec.num_classes, len(spec.sites)
    foot = (
        f"\nTrainable parameters of the reference {spec.ndim}D UNet ({ch} input channel(s), "
        f"{k} classes, {n} sites). BN statistics travel with their layer but count 0. Every "
        "reply also carries the site's training-example count and step metrics (e.g. the "
        "mean loss); the final evaluation reply carries per-region test metrics.\n"
    )
    return "\n".join(lines) + "\n" + foot


START, END = "<!-- privacy-table:start -->", "<!-- privacy-table:end -->"


def update_markdown(path: Path, table: str) -> None:
    """Replace the text between the privacy-table markers of ``path`` with ``table``."""
    text = path.read_text()
    if START not in text or END not in text:
        raise FedsegError(f"{path} has no {START} ... {END} markers")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    path.write_text(f"{head}{START}\n{table}{END}{tail}")
