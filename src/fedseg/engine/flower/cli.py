"""``fedseg flower ...``: run a federation on loopback, join a site, start a run, inspect.

Mounted by the main CLI as ``fedseg flower``; every command needs the ``flower`` extra.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer

from fedseg.console import console, err, fail
from fedseg.errors import ConfigError, FedsegError

app = typer.Typer(
    help="Multi-site federation on Flower (SuperLink + one SuperNode per site).",
    no_args_is_help=True,
)

Overrides = Annotated[list[str] | None, typer.Option("--set", help="Override: key.sub=value.")]
MinSites = Annotated[
    int, typer.Option(help="Valid uploads a round needs (0: a majority of the sites).")
]
RoundTimeout = Annotated[float, typer.Option(help="Seconds to wait for a round's replies.")]
JoinTimeout = Annotated[float, typer.Option(help="Seconds to wait for sites to connect.")]
Retries = Annotated[int, typer.Option(help="Extra attempts of a round that got too few replies.")]


def _logging(verbose: bool) -> None:
    from rich.logging import RichHandler

    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        handlers=[RichHandler(console=err, show_path=False, show_time=False)],
        force=True,
    )


def _config(config: Path | None, resume: Path | None, set_: list[str] | None):
    from fedseg.config import load_config

    if resume is not None:
        return load_config(resume / "config.yaml", set_ or [], run_dump=True)
    if config is None:
        raise typer.BadParameter("give a CONFIG or --resume RUN_DIR")
    return load_config(config, set_ or [])


def _print_results(run_dir: Path) -> None:
    """The run's per-site table, as ``fedseg run`` prints it, and where the run directory is."""
    import json

    from fedseg.run_table import results_table

    results = run_dir / "results.json"
    if results.exists():
        console.print(results_table(json.loads(results.read_text())))
    console.print(f"run directory: {run_dir}", highlight=False, soft_wrap=True)


@app.command()
def local(
    config: Annotated[Path | None, typer.Argument(help="YAML run configuration.")] = None,
    out: Annotated[
        Path | None, typer.Option(help="Run directory (default runs/<name>-<time>).")
    ] = None,
    resume: Annotated[Path | None, typer.Option(help="Continue the run in this directory.")] = None,
    set_: Overrides = None,
    min_sites: MinSites = 0,
    round_timeout: RoundTimeout = 3600.0,
    join_timeout: JoinTimeout = 300.0,
    retries: Retries = 2,
    tls: Annotated[
        bool, typer.Option(help="Serve the SuperLink over TLS (test certificate).")
    ] = False,
    auth: Annotated[bool, typer.Option(help="SuperNode authentication (implies --tls).")] = False,
    split: Annotated[bool, typer.Option(help="Give each site only its own data folder.")] = False,
    threads: Annotated[int, typer.Option(help="Torch threads per site process (0: default).")] = 1,
    overwrite: Annotated[
        bool, typer.Option(help="Replace the finished or failed run already in --out.")
    ] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Run CONFIG as a real federation on this machine: a SuperLink and one SuperNode per site
    on 127.0.0.1 (free ports, temporary FLWR_HOME), stopped when the run ends."""
    from fedseg.data import FederatedDataset
    from fedseg.engine.flower.launcher import LOCAL_SERVER_POLL, LocalFederation
    from fedseg.engine.flower.settings import FlowerSettings, SiteConfig
    from fedseg.engine.flower.site_data import split_federation
    from fedseg.engine.prepare import prepare_data
    from fedseg.engine.rundir import RunDir

    _logging(verbose)
    try:
        cfg = _config(config, resume, set_)
        run_dir = (
            resume or out or Path("runs") / f"{cfg.name}-{datetime.now():%Y%m%d-%H%M%S}"
        ).resolve()
        if resume is None:
            RunDir(run_dir).prepare_new(overwrite)
        root = prepare_data(cfg)
        names = cfg.data.sites or FederatedDataset.open(root).site_names
        dirs = dict.fromkeys(names, root.resolve())
        if split:
            target = run_dir / "site-data"
            existing = {n: target / n for n in names if (target / n).exists()}
            dirs = (
                existing if len(existing) == len(names) else split_federation(root, target, names)
            )
        sites = [SiteConfig(n, dirs[n], run_dir / "sites" / n, threads=threads) for n in names]
        settings = FlowerSettings(
            run_dir=run_dir,
            resume=resume is not None,
            sites=tuple(names),
            min_sites=min_sites,
            round_timeout=round_timeout,
            join_timeout=join_timeout,
            retries=retries,
            poll_interval=LOCAL_SERVER_POLL,
        )
        with (
            tempfile.TemporaryDirectory(prefix="fedseg-flower-") as tmp,
            LocalFederation(
                sites, Path(tmp), tls=tls or auth, auth=auth, log_dir=run_dir / "flower-logs"
            ) as fed,
        ):
            err.print(f"SuperLink on {fed.address}; sites {names}; logs in {fed.log_dir}")
            fed.run(
                cfg,
                settings,
                on_line=lambda line: err.print(line, markup=False, highlight=False, soft_wrap=True),
            )
    except FedsegError as e:
        fail(e)
    _print_results(run_dir)


@app.command()
def server(
    config: Annotated[Path | None, typer.Argument(help="YAML run configuration.")] = None,
    superlink: Annotated[str, typer.Option(help="SuperLink address host:port.")] = "127.0.0.1:8000",
    root_certificates: Annotated[
        Path | None, typer.Option(help="CA certificate of the SuperLink (TLS).")
    ] = None,
    insecure: Annotated[bool, typer.Option(help="Connect without TLS (testing only).")] = False,
    out: Annotated[Path | None, typer.Option(help="Run directory on the SuperLink host.")] = None,
    resume: Annotated[Path | None, typer.Option(help="Continue the run in this directory.")] = None,
    sites: Annotated[
        str | None, typer.Option(help="Site order, comma-separated (default data.sites).")
    ] = None,
    set_: Overrides = None,
    min_sites: MinSites = 0,
    round_timeout: RoundTimeout = 3600.0,
    join_timeout: JoinTimeout = 3600.0,
    retries: Retries = 2,
    overwrite: Annotated[
        bool, typer.Option(help="Replace the finished or failed run already in --out.")
    ] = False,
) -> None:
    """Start CONFIG on a running SuperLink (the coordinator's command) and stream its log.

    The ServerApp runs on the SuperLink host and writes the run directory there."""
    from fedseg.engine.flower.launcher import flower_env, submit_run, write_connection
    from fedseg.engine.flower.settings import FlowerSettings

    try:
        if root_certificates is None and not insecure:
            raise ConfigError("pass --root-certificates CA.crt (TLS) or --insecure (testing only)")
        cfg = _config(config, resume, set_)
        run_dir = (
            resume or out or Path("runs") / f"{cfg.name}-{datetime.now():%Y%m%d-%H%M%S}"
        ).resolve()
        settings = FlowerSettings(
            run_dir=run_dir,
            resume=resume is not None,
            overwrite=overwrite,
            sites=tuple(s for s in (sites or "").split(",") if s),
            min_sites=min_sites,
            round_timeout=round_timeout,
            join_timeout=join_timeout,
            retries=retries,
        )
        with tempfile.TemporaryDirectory(prefix="fedseg-flower-") as tmp:
            home = Path(tmp) / "flwr-home"
            write_connection(home, superlink, None if insecure else root_certificates)
            code = submit_run(
                cfg, settings, Path(tmp) / "app", flower_env(home),
                on_line=lambda line: err.print(line, markup=False, highlight=False, soft_wrap=True),
            )  # fmt: skip
        if code:
            raise FedsegError(f"flwr run exited with code {code}")
    except FedsegError as e:
        fail(e)
    if run_dir.exists():
        _print_results(run_dir)


@app.command()
def site(
    name: Annotated[str, typer.Option(help="This site's name (as in the manifest).")],
    data: Annotated[Path, typer.Option(help="Federation folder holding this site's data.")],
    superlink: Annotated[str, typer.Option(help="SuperLink address host:port.")],
    state_dir: Annotated[
        Path | None, typer.Option(help="Private state folder (default ~/.fedseg/sites/NAME).")
    ] = None,
    root_certificates: Annotated[
        Path | None, typer.Option(help="CA certificate of the SuperLink (TLS).")
    ] = None,
    insecure: Annotated[bool, typer.Option(help="Connect without TLS (testing only).")] = False,
    auth_key: Annotated[
        Path | None, typer.Option(help="This site's private key (SuperNode authentication).")
    ] = None,
    port: Annotated[int, typer.Option(help="Local port of the SuperNode's runtime API.")] = 9094,
    device: Annotated[str | None, typer.Option(help="Overrides engine.device here.")] = None,
    threads: Annotated[int, typer.Option(help="Torch threads (0: default).")] = 0,
) -> None:
    """Join a federation as one site: check the data, then run a Flower SuperNode (process
    isolation) with fedseg's long-lived ClientApp process, which keeps model and data loaded."""
    from fedseg.engine.flower.launcher import process_env, site_command
    from fedseg.engine.flower.settings import SiteConfig
    from fedseg.engine.flower.site_data import check_site_folder

    try:
        if root_certificates is None and not insecure:
            raise ConfigError("pass --root-certificates CA.crt (TLS) or --insecure (testing only)")
        check_site_folder(data, name)
        cfg = SiteConfig(
            name, data.resolve(), (state_dir or Path.home() / ".fedseg/sites" / name).resolve(),
            device=device, threads=threads,
        )  # fmt: skip
    except FedsegError as e:
        fail(e)
    security = ["--insecure"] if insecure else ["--root-certificates", str(root_certificates)]
    argv = [
        "flower-supernode", *security, "--superlink", superlink, "--host", "127.0.0.1",
        "--port", str(port), "--node-config", cfg.to_node_config(),
    ]  # fmt: skip
    if auth_key is not None:
        argv += ["--auth-supernode-private-key", str(auth_key)]
    env = process_env()  # no telemetry or update checks from a hospital network by default
    if shutil.which("flower-supernode", path=env["PATH"]) is None:
        fail(ConfigError("flower-supernode not found; install fedseg with the flower extra"))
    err.print(f"site {name}: data {cfg.data_dir}, private state {cfg.state_root}")
    command = site_command(argv, port)
    os.execve(command[0], command, env)


@app.command("privacy-table")
def privacy_table_cmd(
    pattern: Annotated[str, typer.Argument(help="Shell-style method filter.")] = "*",
    write: Annotated[
        Path | None, typer.Option(help="Replace the table between the markers in this file.")
    ] = None,
) -> None:
    """Which weights (and how many parameters) leave a site each round, per method."""
    from fedseg.engine.flower.privacy import privacy_table, update_markdown

    table = privacy_table(pattern=pattern)
    if write is None:
        console.print(table, markup=False)
        return
    try:
        update_markdown(write, table)
    except FedsegError as e:
        fail(e)
    console.print(f"updated {write}")


@app.command("split-data")
def split_data(
    root: Annotated[Path, typer.Argument(help="Federation folder.")],
    out: Annotated[Path, typer.Argument(help="Output: one federation folder per site.")],
) -> None:
    """Make one federation folder per site (what each hospital keeps) from a full one."""
    from fedseg.engine.flower.site_data import split_federation

    try:
        folders = split_federation(root, out)
    except FedsegError as e:
        fail(e)
    for name, folder in folders.items():
        console.print(f"{name}: {folder}")


@app.command()
def certs(
    out: Annotated[Path, typer.Argument(help="Output folder.")],
    host: Annotated[
        list[str] | None, typer.Option(help="SuperLink host name or IP (repeatable).")
    ] = None,
    site_key: Annotated[
        list[str] | None, typer.Option(help="Also make a SuperNode key pair for this site.")
    ] = None,
) -> None:
    """Pilot certificates: a private CA, a SuperLink certificate, SuperNode key pairs."""
    from fedseg.engine.flower.tls import write_certificates, write_node_key

    files = write_certificates(out, host or ["127.0.0.1", "localhost"])
    console.print(f"CA {files.ca}\nSuperLink certificate {files.cert}, key {files.key}")
    for name in site_key or []:
        key, pub = write_node_key(out / "keys" / name)
        console.print(f"site {name}: private key {key}, public key {pub}")
