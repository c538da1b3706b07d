"""FedLPPA per round: the authors' code against fedseg, side by side, on their toy configuration.

    OMP_NUM_THREADS=1 python benchmarks/authors_toy.py --authors /work/authors/FedLPPA \
        --authors-python /work/authors/venv/bin/python [--rounds 6] \
        [--sides authors fedseg:1 fedseg:2 fedseg:2:bf16 fedseg:2:off:contiguous]

The toy configuration: 2 sites, 8 training images each, 64 px, batch 4, 5 local iterations
per round, evaluation every round (4 test images per site, scored with full masks).

1. Data: a synthetic ``faz`` federation (``fedseg.data.synth``) with its weak labels, written
   twice: as a fedseg federation and in the layout the authors' ``BaseDataSets`` reads
   (``Domain{k}/{train,test}/<id>.h5``; train keys ``image``, ``mask`` and the site's weak key,
   e.g. ``scribble`` or ``keypoint``, with 2 = unlabeled; test keys ``image``, ``mask``).
2. The authors' code (llmir/FedLPPA ``code_v4/flower_pCE_2D_v4_FedLPPA.py``, FedLPPA =
   ``--strategy FedUniV2.1 --model unet_univ5``, their README's arguments scaled to the toy
   configuration) runs unmodified on CPU as 1 Flower 1.0 server + 1 client process per site,
   in its own Python environment, with the shims of ``benchmarks/authors_shims/``
   (``.cuda()`` is a no-op; missing CUDA-only modules are stubs). See
   ``docs/benchmarks_authors.md``.
3. fedseg's ``fedlppa`` runs the same configuration through ``fedseg run`` with
   ``engine.workers`` 1 and 2 (``engine.threads: 1``). A side ``fedseg:N[:AMP[:LAYOUT]]``
   also sets ``engine.amp`` (off, bf16, auto; default: the config default) and the memory
   layout (``channels_last`` or ``contiguous``; default: ``engine.channels_last: auto``),
   so that the part of the gain that comes from precision and layout can be read off. The
   authors' side runs in float32 (``--amp 0``, their default) in the contiguous layout.

Every side is a fresh set of processes started from here. A round's wall time is the time
between two round boundaries seen from here (authors: the server's ``fit_round`` log lines;
fedseg: the records appended to ``rounds.jsonl``); its CPU time is the CPU of all processes of
the side (server, clients, DataLoader and pool workers; ``/proc``) between the same
boundaries. Both include evaluation, checkpoints and logging. The table compares the median
over rounds 2..N-1 (round 1 holds start-up, fedseg's round N the final evaluation) and prints
the speed-up of each fedseg side over the authors' code. One process runs per site
(authors) or per worker (fedseg), each with ``--threads`` torch threads.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import h5py
import numpy as np
import yaml

from fedseg.data import FederatedDataset
from fedseg.data.synth import synthesize
from fedseg.data.weak import generate_weak_labels

SHIMS = Path(__file__).resolve().parent / "authors_shims"
# fedseg annotation -> the authors' h5 key / --sup_type
SUP_TYPE = {
    "scribble": "scribble",
    "scribble2": "scribble_noisy",
    "point": "keypoint",
    "block": "block",
    "box": "box",
    "rotated_box": "box",
}
AUTHORS_DOMAINS = 5  # their FAZ reader lists Domain1..Domain5 whatever the number of clients
POLL = 0.05


@dataclass
class Toy:
    """The shared toy configuration."""

    sites: int = 2
    train: int = 8
    test: int = 4
    size: int = 64
    batch: int = 4
    iters: int = 5
    rounds: int = 6
    seed: int = 0
    threads: int = 1


@dataclass
class SideResult:
    """Round boundaries of one side: wall seconds since launch and CPU seconds of its processes."""

    name: str
    walls: list[float] = field(default_factory=list)
    cpus: list[float] = field(default_factory=list)
    total_wall: float = 0.0
    total_cpu: float = 0.0
    precision: str = "float32 (their --amp 0)"
    """The arithmetic the side ran (fedseg: as its results.json records)."""

    def rounds(self) -> list[tuple[float, float]]:
        """(wall, CPU) of each interval between consecutive boundaries."""
        return [
            (self.walls[i + 1] - self.walls[i], self.cpus[i + 1] - self.cpus[i])
            for i in range(len(self.walls) - 1)
        ]


def prepare(toy: Toy, work: Path) -> tuple[Path, Path, list[str]]:
    """Write the fedseg federation and the authors' h5 copy; return both roots and sup types."""
    fed_root, h5_root = work / "federation", work / "FAZ_h5"
    if toy.sites > AUTHORS_DOMAINS:
        raise SystemExit(f"--sites: the authors' FAZ reader has {AUTHORS_DOMAINS} domains")
    n = toy.train + toy.test
    synthesize(
        "faz",
        fed_root,
        sites=toy.sites,
        size=toy.size,
        per_site=n,
        seed=toy.seed,
        split=(toy.train / n, 0.0, toy.test / n),
        site_weights=[1.0] * toy.sites,
        overwrite=True,
    )
    generate_weak_labels(fed_root, seed=toy.seed)
    fed = FederatedDataset.open(fed_root)
    shutil.rmtree(h5_root, ignore_errors=True)
    sup_types = []
    ignore, unlabeled = fed.manifest.ignore_index, fed.manifest.num_classes
    for k in range(AUTHORS_DOMAINS):
        for part in ("train", "test"):
            (h5_root / f"Domain{k + 1}" / part).mkdir(parents=True)
    for k, site in enumerate(fed.manifest.sites):
        sup = SUP_TYPE[site.annotation]
        sup_types.append(sup)
        for part in ("train", "test"):
            split = fed.load(site.name, part, labels="weak")
            want = toy.train if part == "train" else toy.test
            if len(split.ids) != want:
                raise SystemExit(f"site {site.name} {part}: {len(split.ids)} images, not {want}")
            for i, sid in enumerate(split.ids):
                with h5py.File(h5_root / f"Domain{k + 1}" / part / f"{sid}.h5", "w") as h5:
                    h5["image"] = split.images[i, 0].numpy()
                    h5["mask"] = split.masks[i].numpy().astype(np.uint8)
                    if part == "train":
                        weak = split.labels[i].numpy()
                        h5[sup] = np.where(weak == ignore, unlabeled, weak).astype(np.uint8)
    return fed_root, h5_root, sup_types


def _tree_cpu(roots: list[int]) -> float:
    """CPU seconds (user + system, reaped children included) of ``roots`` and descendants."""
    own: dict[int, int] = {}
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        pid = int(entry.name)
        own[pid] = sum(int(f) for f in fields[11:15])
        children.setdefault(int(fields[1]), []).append(pid)
    total, stack = 0, list(roots)
    while stack:
        pid = stack.pop()
        total += own.get(pid, 0)
        stack.extend(children.get(pid, []))
    return total / os.sysconf("SC_CLK_TCK")


def _children_cpu() -> float:
    """CPU seconds of every reaped descendant of this process (orphans too: see main)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _reap_all(timeout: float = 30.0) -> None:
    """Wait for every remaining child, e.g. pool processes orphaned when a run exits."""
    end = time.perf_counter() + timeout
    while time.perf_counter() < end:
        try:
            if os.waitpid(-1, os.WNOHANG) == (0, 0):
                time.sleep(POLL)
        except ChildProcessError:
            return


def _exited(p: subprocess.Popen[bytes]) -> bool:
    """Whether ``p`` has exited, leaving it unreaped so that its /proc times stay readable
    (once reaped, e.g. by the crash check of :func:`_watch`, it has exited too)."""
    if p.returncode is not None:
        return True
    return os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _watch(
    procs: dict[str, subprocess.Popen[bytes]],
    boundary: Callable[[], int],
    done: Callable[[], bool],
    result: SideResult,
    t0: float,
    timeout: float,
) -> None:
    """Record a boundary each time ``boundary()`` grows, until ``done()``; fail on a crash."""
    roots = [p.pid for p in procs.values()]
    seen = 0
    while True:
        finished = done()  # before the count: a boundary written just before the end is seen
        count = boundary()
        while seen < count:
            seen += 1
            result.walls.append(time.perf_counter() - t0)
            result.cpus.append(_tree_cpu(roots))
        if finished:
            return
        for name, p in procs.items():
            if _exited(p) and p.wait() != 0:
                raise RuntimeError(f"{result.name}: {name} exited with {p.returncode}")
        if time.perf_counter() - t0 > timeout:
            raise TimeoutError(f"{result.name}: no end after {timeout:.0f} s")
        time.sleep(POLL)


def _stop(procs: dict[str, subprocess.Popen[bytes]]) -> None:
    """End the process groups this script started (each was started in a new session)."""
    for p in procs.values():
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    for p in procs.values():
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def _launch(cmd: list[str], cwd: Path, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float) -> None:
    end = time.perf_counter() + timeout
    while time.perf_counter() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"authors' server exited with {proc.returncode} before listening")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(POLL)
    raise TimeoutError(f"authors' server not listening on {port} after {timeout:.0f} s")


def run_authors(
    toy: Toy,
    work: Path,
    h5_root: Path,
    sup_types: list[str],
    code: Path,
    python: str,
    timeout: float,
) -> SideResult:
    """The authors' FedLPPA: one Flower server and one client process per site."""
    cwd = work / "authors" / "cwd"  # their outputs go to ../model/<exp>, their code copy to it
    shutil.rmtree(work / "authors", ignore_errors=True)
    cwd.mkdir(parents=True)
    logs = work / "authors" / "logs"
    logs.mkdir()
    port = _free_port()
    script = str(code / "flower_pCE_2D_v4_FedLPPA.py")
    env = dict(os.environ)
    env.update(
        PYTHONPATH=str(SHIMS),
        OMP_NUM_THREADS=str(toy.threads),
        MKL_NUM_THREADS=str(toy.threads),
        MPLBACKEND="Agg",
        GRPC_ENABLE_FORK_SUPPORT="0",  # their DataLoader forks 4 workers inside gRPC callbacks
        PYTHONWARNINGS="ignore",
    )
    args = [
        "--root_path", str(h5_root), "--num_classes", "2", "--in_chns", "1",
        "--img_class", "faz", "--exp", "toy/FedLPPA", "--model", "unet_univ5",
        "--max_iterations", str(toy.iters * toy.rounds), "--iters", str(toy.iters),
        "--eval_iters", str(toy.iters), "--tsne_iters", str(toy.iters * (toy.rounds + 1)),
        "--batch_size", str(toy.batch), "--base_lr", "0.01", "--amp", "0",
        "--server_address", f"127.0.0.1:{port}", "--strategy", "FedUniV2.1",
        "--min_num_clients", str(toy.sites), "--img_size", str(toy.size),
        "--alpha", "0.1", "--beta", "0.5", "--prompt", "universal", "--attention", "dual",
        "--dual_init", "aggregated", "--label_prompt", "1", "--seed", str(2022 + toy.seed),
        "--gpu", "0",
    ]  # fmt: skip
    server_log = work / "authors" / "model" / "toy" / "FedLPPA" / "server.log"
    result = SideResult("authors")
    procs: dict[str, subprocess.Popen[bytes]] = {}
    text = ""

    def read_log() -> str:
        nonlocal text
        if server_log.exists():
            text = server_log.read_text(errors="replace")
        return text

    t0, c0 = time.perf_counter(), _children_cpu()
    try:
        server = [python, script, *args, "--role", "server", "--client", "client_all"]
        procs["server"] = _launch([*server, "--sup_type", "mask"], cwd, env, logs / "server.out")
        _wait_port(port, procs["server"], timeout)
        for k, sup in enumerate(sup_types):
            client = [python, script, *args, "--role", "client", "--cid", str(k)]
            procs[f"client{k}"] = _launch(
                [*client, "--client", f"client{k + 1}", "--sup_type", sup],
                cwd,
                env,
                logs / f"client{k}.out",
            )
        fit = re.compile(r"fit_round \d+: strategy sampled")
        _watch(
            procs,
            lambda: len(fit.findall(read_log())) + ("app_fit: losses" in text),
            lambda: "app_fit: losses" in text,
            result,
            t0,
            timeout,
        )
        for p in procs.values():
            p.wait(60)
        result.total_wall = time.perf_counter() - t0
    finally:
        _stop(procs)
    _reap_all()
    result.total_cpu = _children_cpu() - c0
    return result


SIDE = re.compile(r"fedseg:([1-9]\d*)(?::(off|bf16|auto))?(?::(channels_last|contiguous))?")
"""A fedseg side: workers, then optionally ``engine.amp`` and the memory layout."""


def run_fedseg(toy: Toy, work: Path, fed_root: Path, side: str, timeout: float) -> SideResult:
    """fedseg's FedLPPA through ``fedseg run`` as ``side`` (:data:`SIDE`) says."""
    match = SIDE.fullmatch(side)
    assert match is not None
    workers, amp, layout = int(match[1]), match[2], match[3]
    engine: dict[str, object] = {"device": "cpu", "threads": toy.threads, "workers": workers}
    if amp:
        engine["amp"] = amp
    if layout:
        engine["channels_last"] = layout == "channels_last"
    name, tag = side, side.replace(":", "_")
    config = {
        "name": f"authors_toy_{tag}",
        "seed": toy.seed,
        "data": {"root": str(fed_root), "labels": "weak"},
        "method": {"name": "fedlppa"},
        "train": {
            "rounds": toy.rounds,
            "local_iters": toy.iters,
            "batch_size": toy.batch,
            "optimizer": "adamw",
            "lr": 0.01,
            "weight_decay": 0.01,
            "lr_schedule": "poly",
            "augment": True,
            "rotation": "paper_45",
        },
        "eval": {"every": 1, "periodic_split": "test"},
        "engine": engine,
    }
    cfg = work / f"{tag}.yaml"
    cfg.write_text(yaml.safe_dump(config, sort_keys=False))
    run_dir = work / tag
    shutil.rmtree(run_dir, ignore_errors=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(toy.threads), MKL_NUM_THREADS=str(toy.threads))
    fedseg = Path(sys.executable).with_name("fedseg")
    cmd = [str(fedseg), "run", str(cfg), "--out", str(run_dir)]
    rounds_file = run_dir / "rounds.jsonl"
    result = SideResult(name)
    procs: dict[str, subprocess.Popen[bytes]] = {}

    def appended() -> int:
        return rounds_file.read_text().count("\n") if rounds_file.exists() else 0

    t0, c0 = time.perf_counter(), _children_cpu()
    result.walls.append(0.0)
    result.cpus.append(0.0)
    try:
        run = procs["run"] = _launch(cmd, work, env, work / f"{tag}.out")
        ends = toy.rounds - 1  # rounds.jsonl lines before the exit
        _watch(procs, lambda: min(appended(), ends), partial(_exited, run), result, t0, timeout)
        result.total_wall = time.perf_counter() - t0  # the exit: round N + final evaluation
        if run.wait() != 0:
            raise RuntimeError(f"{name}: fedseg run exited with {run.returncode}")
    finally:
        _stop(procs)
    _reap_all()  # worker processes outlive the run's exit by a moment
    result.total_cpu = _children_cpu() - c0
    result.walls.append(result.total_wall)
    result.cpus.append(result.total_cpu)
    used = json.loads((run_dir / "results.json").read_text())["precision"]
    arithmetic = {"off": "float32"}.get(used["amp"], f"{used['amp']} autocast")
    result.precision = arithmetic + (", channels-last" if used["channels_last"] else "")
    return result


def summarise(toy: Toy, results: list[SideResult], first: int = 2) -> dict[str, dict[str, object]]:
    """Per side: launch to the end of round 1, and (wall, CPU) of the compared rounds.

    Authors' boundaries are the starts of rounds 1..N and the end of round N; fedseg's are the
    launch, the ends of rounds 1..N-1 and the exit (round N plus the final evaluation). The
    k-th interval is round k on both sides (fedseg's first also holds start-up), so the
    compared rounds 2..N-1 are the same slice; with N = 2 it is round 2, which for fedseg
    then includes the final evaluation. ``first`` moves the start of the compared rounds
    (e.g. past the rounds in which the authors' code skips its learnable aggregation).
    """
    out: dict[str, dict[str, object]] = {}
    last = max(2, toy.rounds - 1)
    for res in results:
        steady = res.rounds()[first - 1 : last]
        out[res.name] = {
            "to_end_of_round_1_s": res.walls[1],
            "compared_rounds": [first, last],
            "rounds": [[round(w, 3), round(c, 3)] for w, c in res.rounds()],
            "median_wall_s": statistics.median(w for w, _ in steady),
            "median_cpu_s": statistics.median(c for _, c in steady),
            "total_wall_s": res.total_wall,
            "total_cpu_s": res.total_cpu,
            "precision": res.precision,
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--authors", type=Path, default=Path("/work/authors/FedLPPA"))
    ap.add_argument("--authors-python", default="/work/authors/venv/bin/python")
    ap.add_argument("--work", type=Path, default=Path("/tmp/fedseg_authors_toy"))
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--sites", type=int, default=2)
    ap.add_argument("--train", type=int, default=8)
    ap.add_argument("--test", type=int, default=4)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=540.0, help="seconds per side")
    ap.add_argument(
        "--from-round",
        type=int,
        default=2,
        help="first compared round (their learnable aggregation starts in round 11)",
    )
    ap.add_argument(
        "--sides", nargs="+", default=["authors", "fedseg:1", "fedseg:2"],
        help="authors and/or fedseg:N[:AMP[:LAYOUT]] (N = engine.workers; AMP off, bf16 or "
        "auto; LAYOUT channels_last or contiguous)",
    )  # fmt: skip
    args = ap.parse_args()
    if args.rounds < 2:
        ap.error("--rounds must be at least 2 (round 1 holds start-up)")
    if not 2 <= args.from_round <= max(2, args.rounds - 1):
        ap.error("--from-round must lie in 2 .. rounds - 1")
    bad = [s for s in args.sides if s != "authors" and not SIDE.fullmatch(s)]
    if bad:
        ap.error(f"--sides: unknown sides {bad} (authors, fedseg:N[:AMP[:LAYOUT]])")
    code = args.authors / "code_v4"
    if "authors" in args.sides and not (code / "flower_pCE_2D_v4_FedLPPA.py").is_file():
        ap.error(f"--authors: {code}/flower_pCE_2D_v4_FedLPPA.py not found")
    toy = Toy(
        args.sites, args.train, args.test, args.size, args.batch, args.iters,
        args.rounds, args.seed, args.threads,
    )  # fmt: skip
    args.work.mkdir(parents=True, exist_ok=True)
    # orphans (pool processes of a run that has exited) become children of this process, so
    # that their CPU time is counted when they are reaped (PR_SET_CHILD_SUBREAPER = 36)
    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)
    fed_root, h5_root, sup_types = prepare(toy, args.work)
    print(f"toy: {toy}; sites' weak labels: {sup_types}; load {os.getloadavg()[0]:.2f}")
    results = []
    for side in args.sides:
        if side == "authors":
            res = run_authors(
                toy, args.work, h5_root, sup_types, code, args.authors_python, args.timeout
            )
        else:
            res = run_fedseg(toy, args.work, fed_root, side, args.timeout)
        results.append(res)
        print(
            f"{side}: {res.total_wall:.1f} s wall, {res.total_cpu:.1f} s CPU in all; "
            f"load {os.getloadavg()[0]:.2f}",
            flush=True,
        )
    summary = summarise(toy, results, args.from_round)
    (args.work / "authors_toy.json").write_text(json.dumps(summary, indent=1))
    base = summary.get("authors")
    first, last = args.from_round, max(2, toy.rounds - 1)
    print(
        "\n| side | precision | launch to end of round 1 s | wall s/round | CPU s/round | wall "
        "speed-up vs authors | CPU authors/side | every round (wall, CPU) |\n"
        "|---|---|---|---|---|---|---|---|"
    )
    for name, s in summary.items():
        wall, cpu = float(s["median_wall_s"]), float(s["median_cpu_s"])  # type: ignore[arg-type]
        speed = f"{float(base['median_wall_s']) / wall:.2f}" if base else "-"  # type: ignore[arg-type]
        ratio = f"{float(base['median_cpu_s']) / cpu:.2f}" if base else "-"  # type: ignore[arg-type]
        print(
            f"| {name} | {s['precision']} | {s['to_end_of_round_1_s']:.1f} | {wall:.3f} "
            f"| {cpu:.3f} | {speed} "
            f"| {ratio} | {s['rounds']} |"
        )
    print(
        f"\nper round: median over rounds {first}..{last}; results in {args.work}/authors_toy.json"
    )


if __name__ == "__main__":
    main()
