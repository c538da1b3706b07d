"""FedLPPA's ablations (Table VII, Table VIII, Fig. 9, Fig. 8) at one stated CPU budget.

    OMP_NUM_THREADS=1 python benchmarks/fedlppa_ablation.py [--group table7 ...] [--seed 0]
        [--set KEY=VALUE ...] [--out DIR]

Every row is a shipped config (``configs/fedlppa/{table7,table8,fig9,fig8}_*.yaml``: the
synthetic 5-site FAZ federation, 64 px, weak labels by the current rules) run with
``fedseg run`` under ``BUDGET`` and nothing else changed. Rows run one at a time, each in its
own process (wall and CPU seconds of that process are measured here); a row whose method
settings equal an earlier row's (FedLPPA with every component is a row of all four groups)
reuses that run. All rows share one federation (``OUT/data``), written by the first row.
Rows whose ``timing.json`` records success are not run again, so an interrupted invocation
continues where it stopped. Prints markdown: per-site DSC / HD95 beside the paper's FAZ
columns, and the LA-weight and prompt-affinity statistics each run logged per round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedseg.config import load_config, method_config
from fedseg.reproduce.papers import load_paper

BUDGET = ["train.rounds=10", "train.local_iters=5"]
"""Overrides of every row: the issue-12 benchmark's schedule (10 rounds x 5 iterations);
data, batch size, optimiser, learning rate and schedule stay as the shipped configs set them."""

FIGURES = {
    "fig9": (
        "Fig. 9: server-side auxiliary decoder strategy",
        [
            ("RD (random)", "fig9_random"),
            ("FO (fixed order)", "fig9_fixed_order"),
            ("HPS (highest prompt similarity)", "fig9_highest_similarity"),
            ("PSA (prompt similarity aggregated)", "fig9_similarity_aggregated"),
        ],
    ),
    "fig8": (
        "Fig. 8: feature fusion and enhancement block",
        [
            ("none", "fig8_none"),
            ("CA (channel attention)", "fig8_channel"),
            ("SA (spatial attention)", "fig8_spatial"),
            ("DA (dual attention)", "fig8_dual"),
        ],
    ),
}
GROUPS = ("table7", "table8", "fig9", "fig8")
"""Order of priority: the component ablation first."""


@dataclass
class Row:
    """One row of one group; ``published`` is the paper's (FAZ DSC, FAZ HD95) if it has one."""

    group: str
    label: str
    config: str
    published: tuple[float, float] | None
    out: Path
    same_as: Row | None = None

    @property
    def run(self) -> Row:
        """The row whose run directory holds this row's results."""
        return self.same_as or self


def rows_of(group: str, root: Path) -> tuple[str, list[Row]]:
    """The title and rows of ``group``; tables take their rows from the paper's file."""
    if group in FIGURES:
        title, items = FIGURES[group]
        return title, [Row(group, label, f"fedlppa/{c}", None, root / c) for label, c in items]
    table = load_paper("fedlppa").table(group)
    faz = table.columns.index("FAZ DSC")
    rows = []
    for r in table.rows:
        published = r.published[faz], r.published[faz + 1]
        name = r.config.split("/")[-1]
        rows.append(Row(group, r.label, r.config, published, root / name))  # type: ignore[arg-type]
    return table.title, rows


def overrides(root: Path, seed: int) -> list[str]:
    """The budget, the shared federation's folder and the seed."""
    return [*BUDGET, f"data.root={root / 'data' / 'faz'}", f"seed={seed}"]


def settings_key(row: Row, sets: list[str]) -> str:
    """What the run computes: the resolved config without its name, and the method's
    validated settings (prompts as a set: the network uses them by membership)."""
    cfg = load_config(row.config, sets).model_dump(mode="json")
    cfg.pop("name")
    settings = method_config(cfg.pop("method")).model_dump(mode="json")
    settings["prompts"] = sorted(settings["prompts"])
    return json.dumps([cfg, settings], sort_keys=True)


def run_row(row: Row, sets: list[str]) -> dict[str, Any]:
    """Run one row in its own process; record and return its wall and CPU seconds."""
    exe = str(Path(sys.executable).with_name("fedseg"))
    cmd = [exe, "run", row.config, "--out", str(row.out / "run"), "--overwrite"]
    for item in sets:
        cmd += ["--set", item]
    row.out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    with (row.out / "log.txt").open("w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
    timing = {
        "wall": time.perf_counter() - start,
        "cpu": usage.ru_utime + usage.ru_stime,
        "rc": os.waitstatus_to_exitcode(status),
    }
    (row.out / "timing.json").write_text(json.dumps(timing))
    return timing


def _json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def personal_stats(run_dir: Path) -> dict[str, list[float]]:
    """Per round: mean over sites of the LA statistics, and the server's affinity numbers
    (affinity drift since round 1, spread of the off-diagonal entries, aux self weight)."""
    series: dict[str, list[float]] = {}
    path = run_dir / "rounds.jsonl"
    if not path.is_file():
        return series
    for line in path.read_text().splitlines():
        entry = json.loads(line)
        clients = list(entry.get("clients", {}).values())
        for key in ("la_main_mean", "la_main_min", "la_main_local_share", "la_aux_local_share"):
            if clients and key in clients[0]:
                series.setdefault(key, []).append(statistics.fmean(c[key] for c in clients))
        server = entry.get("server", {})
        for key in ("affinity_drift", "aux_self_weight"):
            if key in server:
                series.setdefault(key, []).append(float(server[key]))
        if "affinity" in server:
            a = server["affinity"]
            off = [a[i][j] for i in range(len(a)) for j in range(len(a)) if i != j]
            series.setdefault("affinity_min", []).append(min(off))
            series.setdefault("affinity_max", []).append(max(off))
    return series


def _cell(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def render(title: str, rows: list[Row]) -> str:
    """Two markdown tables: metrics beside the paper, and the personal parts' statistics."""
    results = {id(r): _json(r.run.out / "run" / "results.json") for r in rows}
    sites = next((list(res["sites"]) for res in results.values() if res), [])
    manifest = _json(rows[0].run.out.parent / "data" / "faz" / "manifest.json")
    kinds = {s["name"]: s["annotation"] for s in manifest.get("sites", [])}
    head = [f"{s} ({kinds.get(s, '?')})" for s in sites]
    lines = [
        f"### {title}",
        "",
        "DSC % / HD95 px per site (test split, full masks), averages over sites, the paper's "
        "FAZ columns, and the row's process time.",
        "",
        "| row | "
        + " | ".join(head)
        + " | DSC avg | HD95 avg | prec / rec | paper DSC | paper HD95 | wall s | CPU s |",
        "|---" * (len(head) + 8) + "|",
    ]
    for row in rows:
        res, tim = results[id(row)], _json(row.run.out / "timing.json")
        cells = [row.label]
        if not res:
            state = f"failed (rc {tim['rc']})" if tim else "not run"
            cells += [state] * (len(head) + 3)
        else:
            per = res["sites"]
            cells += [
                f"{100 * per[s]['dsc']['faz']:.1f} / {per[s]['hd95']['faz']:.1f}" for s in sites
            ]
            avg = res["average"]
            cells += [
                f"{100 * avg['dsc']['faz']:.2f}",
                f"{avg['hd95']['faz']:.2f}",
                f"{100 * avg['precision']['faz']:.0f} / {100 * avg['recall']['faz']:.0f}",
            ]
        pub = row.published
        cells += [_cell(pub[0]) if pub else "fig.", _cell(pub[1]) if pub else "fig."]
        if row.same_as is not None:
            cells += [f"= {row.same_as.group} {row.same_as.label}", ""]
        else:
            cells += [f"{tim.get('wall', float('nan')):.0f}", f"{tim.get('cpu', float('nan')):.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "Personal parts, last round (round 1 -> last for the affinity; means over sites): LA "
        "weight of the main decoder (mean, min), local share kept of the main / aux decoder, "
        "off-diagonal affinity range, affinity drift since round 1, aux self weight.",
        "",
        "| row | LA W main mean | LA W main min | local share main | local share aux "
        "| affinity off-diag (round 1 -> last) | affinity drift | aux self weight |",
        "|---" * 8 + "|",
    ]
    for row in rows:
        s = personal_stats(row.run.out / "run")

        def last(key: str, digits: int = 4, s: dict[str, list[float]] = s) -> str:
            return _cell(s[key][-1], digits) if s.get(key) else "—"

        aff = (
            f"{s['affinity_min'][0]:.3f}-{s['affinity_max'][0]:.3f} -> "
            f"{s['affinity_min'][-1]:.3f}-{s['affinity_max'][-1]:.3f}"
            if s.get("affinity_min")
            else "—"
        )
        lines.append(
            f"| {row.label} | {last('la_main_mean')} | {last('la_main_min')} | "
            f"{last('la_main_local_share')} | {last('la_aux_local_share')} | {aff} | "
            f"{last('affinity_drift')} | {last('aux_self_weight', 3)} |"
        )
    return "\n".join(lines) + "\n"


def trajectory(row: Row) -> str:
    """Round-by-round LA and affinity statistics of one run (markdown)."""
    s = personal_stats(row.run.out / "run")
    keys = [
        k
        for k in (
            "la_main_mean",
            "la_main_min",
            "la_main_local_share",
            "la_aux_local_share",
            "affinity_drift",
            "aux_self_weight",
        )
        if k in s
    ]
    if not keys:
        return ""
    lines = [
        f"Per round, {row.group} {row.label}:",
        "",
        "| round | " + " | ".join(keys) + " |",
        "|---" * (len(keys) + 1) + "|",
    ]
    for r in range(len(s[keys[0]])):
        lines.append(f"| {r + 1} | " + " | ".join(f"{s[k][r]:.4f}" for k in keys) + " |")
    return "\n".join(lines) + "\n"


def plan(root: Path, sets: list[str]) -> list[tuple[str, str, list[Row]]]:
    """Every group's rows under ``root``; a row repeating an earlier one (in priority
    order) points to it."""
    seen: dict[str, Row] = {}
    groups = []
    for group in GROUPS:
        title, rows = rows_of(group, root)
        for row in rows:
            key = settings_key(row, sets)
            row.same_as = seen.get(key)
            seen.setdefault(key, row)
        groups.append((group, title, rows))
    return groups


def summary(out: Path, seeds: list[int], chosen: list[str]) -> str:
    """Per group, the average DSC of each seed, their mean, the mean HD95 and per-site DSC,
    the mean local share of the main decoder, beside the paper's FAZ numbers (markdown)."""
    plans = {k: plan(out / f"seed{k}", overrides(out / f"seed{k}", k)) for k in seeds}
    parts = []
    for g, (group, title, rows) in enumerate(plans[seeds[0]]):
        if group not in chosen:
            continue
        sites: list[str] = []
        lines = []
        for i, row in enumerate(rows):
            res = [_json(p[g][2][i].run.out / "run" / "results.json") for p in plans.values()]
            res = [r for r in res if r]
            if not res:
                continue
            sites = sites or list(res[0]["sites"])
            dsc = [100 * r["average"]["dsc"]["faz"] for r in res]
            hd = statistics.fmean(r["average"]["hd95"]["faz"] for r in res)
            per = [statistics.fmean(100 * r["sites"][s]["dsc"]["faz"] for r in res) for s in sites]
            share = [
                personal_stats(p[g][2][i].run.out / "run").get("la_main_local_share", [None])[-1]
                for p in plans.values()
            ]
            known = [v for v in share if v is not None]
            pub = row.published
            cells = [
                row.label,
                ", ".join(f"{v:.1f}" for v in dsc),
                f"{statistics.fmean(dsc):.1f}",
                *(f"{v:.1f}" for v in per),
                f"{hd:.1f}",
                _cell(statistics.fmean(known), 3) if known else "—",
                _cell(pub[0]) if pub else "fig.",
                _cell(pub[1]) if pub else "fig.",
            ]
            lines.append("| " + " | ".join(cells) + " |")
        head = ["row", "DSC avg per seed", "DSC mean", *(f"DSC {s}" for s in sites)]
        head += ["HD95 mean", "local share main", "paper DSC", "paper HD95"]
        parts.append(
            "\n".join(
                [
                    f"### {title}: seeds {', '.join(map(str, seeds))}",
                    "",
                    "| " + " | ".join(head) + " |",
                    "|---" * len(head) + "|",
                    *lines,
                ]
            )
        )
    return "\n\n".join(parts) + "\n"


def main() -> None:
    """Run the chosen groups' rows (or only render them with --render); print markdown."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/fedlppa-ablation"))
    parser.add_argument("--group", action="append", choices=GROUPS, help="default: all")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra override of every row (e.g. method.affinity_prompts=aggregated)",
    )
    parser.add_argument("--render", action="store_true", help="only render finished rows")
    parser.add_argument("--summary", help="only summarise these seeds' runs, e.g. 0,1")
    args = parser.parse_args()
    chosen = [g for g in GROUPS if g in (args.group or GROUPS)]
    if args.summary:
        seeds = [int(k) for k in args.summary.split(",")]
        print(summary(args.out.resolve(), seeds, chosen))
        return
    root = args.out.resolve() / f"seed{args.seed}"
    sets = overrides(root, args.seed) + args.set
    rendered = []
    for group, title, rows in plan(root, sets):
        if group not in chosen:
            continue
        for row in rows:
            if not args.render and _json(row.run.out / "timing.json").get("rc") != 0:
                t = run_row(row.run, sets)
                print(
                    f"{group} {row.run.label}: rc {t['rc']}, {t['wall']:.0f} s wall, "
                    f"{t['cpu']:.0f} s CPU",
                    flush=True,
                )
        rendered.append(render(title, rows))
        if group == "table7":
            rendered.append(trajectory(rows[-1]))
    budget = " ".join(f"--set {s}" for s in [*BUDGET, *args.set])
    print(f"Budget: shipped configs with {budget}, seed {args.seed}.\n")
    print("\n".join(rendered))


if __name__ == "__main__":
    main()
