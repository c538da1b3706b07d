"""Pieces of the Flower engine: records, site state, settings, data split, certificates,
the privacy table and the command line."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import tomli
import torch
from flower_helpers import make_config
from typer.testing import CliRunner

from fedseg.data import FederatedDataset
from fedseg.engine.flower.cli import app as flower_cli
from fedseg.engine.flower.privacy import privacy_rows, privacy_table, update_markdown
from fedseg.engine.flower.records import (
    content,
    eval_record,
    read_eval,
    read_payload,
)
from fedseg.engine.flower.settings import (
    FlowerSettings,
    SiteConfig,
    app_pyproject,
    run_config_of,
)
from fedseg.engine.flower.site_data import check_site_folder, split_federation
from fedseg.engine.flower.tls import write_certificates, write_node_key
from fedseg.engine.server import spec_from_json, spec_to_json
from fedseg.engine.site_state import SiteStateStore
from fedseg.errors import ConfigError, DataError, FedsegError, UploadError
from fedseg.methods import Payload, get_method
from fedseg.testing import toy_federation

pytestmark = pytest.mark.flower


def test_payload_round_trips_through_records_with_dtypes_and_scalars():
    p = Payload(
        {"w": torch.randn(3, 2), "n": torch.tensor(7), "h": torch.ones(4, dtype=torch.float16)},
        {"loss": 0.25, "k": 3},
        num_examples=12,
    )
    back = read_payload(content({"round": 1}, payload=p))
    assert back.num_examples == 12 and back.metrics == {"loss": 0.25, "k": 3.0}
    for k, v in p.tensors.items():
        assert back.tensors[k].dtype == v.dtype
        torch.testing.assert_close(back.tensors[k], v, rtol=0, atol=0)
    assert read_payload(content({}, payload=Payload(num_examples=3))).tensors == {}


def test_malformed_message_bodies_raise_upload_errors():
    with pytest.raises(UploadError, match="no 'arrays'"):
        read_payload(content({"num-examples": 3}))
    body = content({}, payload=Payload({"w": torch.ones(1)}, num_examples=1))
    body["fedseg"]["num-examples"] = "many"
    with pytest.raises(UploadError, match="num-examples must be an int"):
        read_payload(body)
    bad_layouts = {
        "covers more than the 4 bytes": [["w", "float32", [1]], ["v", "float32", [1]]],
        "covers 0 bytes, 4 were sent": [],
        "bad layout entry": [["w", "object", [1]]],  # no pickled objects
        "bad layout entry ": [["w", "float32", [-1]]],
    }
    for reason, layout in bad_layouts.items():
        body = content({}, payload=Payload({"w": torch.ones(1)}, num_examples=1))
        body["fedseg"]["layout"] = json.dumps(layout)
        with pytest.raises(UploadError, match=reason.strip()):
            read_payload(body)


def test_payload_tensors_travel_as_one_packed_array():
    """One Flower Array per payload (Flower sends each array as separate objects), whose
    bytes are the tensors' bytes one after another."""
    tensors = {"a": torch.randn(5, 3), "b": torch.arange(4), "c": torch.tensor(True)}
    body = content({}, payload=Payload(tensors, num_examples=2))
    (array,) = body["arrays"].values()
    raw = b"".join(t.numpy().tobytes() for t in tensors.values())
    assert array.numpy().tobytes() == raw and array.shape == (len(raw),)


def test_spec_and_evaluation_round_trip():
    spec, _ = toy_federation(3)
    assert spec_from_json(spec_to_json(spec)) == spec
    metrics = {"dsc": {"fg": 0.5, "all/fg": 0.25}, "hd95": {"fg": float("nan")}}
    cases = [{"id": "a", "metrics": {"dsc": {"fg": 0.1, "all/fg": 0.2}}}]
    back = read_eval(eval_record(metrics, 4, cases))
    assert back.cases == 4 and back.metrics["dsc"] == {"fg": 0.5, "all/fg": 0.25}
    assert math.isnan(back.metrics["hd95"]["fg"])
    assert back.per_case == [{"index": 0, "id": None, "metrics": cases[0]["metrics"]}]


def test_site_state_is_atomic_pruned_and_read_before_a_round(tmp_path: Path):
    store = SiteStateStore(tmp_path / "s", keep=3)
    assert store.latest_before(5) is None and store.rounds() == []
    for r in range(4):
        store.save(r, {"weights": {"x": torch.full((2,), float(r))}, "r": r})
    assert store.rounds() == [1, 2, 3]
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == [
        "round-00001.pt",
        "round-00002.pt",
        "round-00003.pt",
    ]  # no temporary files left behind
    r, state = store.latest_before(3)  # type: ignore[misc]
    assert r == 2 and state["r"] == 2
    assert store.latest_before(1) is None


def test_node_config_round_trips_through_flowers_parser(tmp_path: Path):
    from flwr.common.config import parse_config_args

    site = SiteConfig("hosp A", tmp_path / "my data", tmp_path / "state", device="cpu", threads=2)
    parsed = parse_config_args([site.to_node_config()])
    assert SiteConfig.from_node_config(parsed) == site
    with pytest.raises(ConfigError, match=r"lacks \['data-dir'\]"):
        SiteConfig.from_node_config({"site-name": "A"})


def test_app_pyproject_is_a_valid_flower_app_carrying_the_config(federation: Path, tmp_path: Path):
    from flwr.common.config import validate_config

    cfg = make_config(federation, "fedbn")
    st = FlowerSettings(run_dir=tmp_path / "run", sites=("A", "B"), min_sites=1, retries=0)
    raw = tomli.loads(app_pyproject(cfg, st))
    ok, errors, _ = validate_config(raw, check_module=True)
    assert ok, errors
    rc = raw["tool"]["flwr"]["app"]["config"]
    assert run_config_of(rc) == cfg
    back = FlowerSettings.from_run_config(rc)
    assert back.sites == ("A", "B") and back.min_sites == 1 and back.retries == 0
    assert back.run_dir == (tmp_path / "run").resolve()
    with pytest.raises(ConfigError, match="round-timeout must be > 0"):
        FlowerSettings.from_run_config({**rc, "round-timeout": 0.0})


def test_site_process_answers_only_fedseg_apps(federation: Path, tmp_path: Path):
    """The long-lived site process runs fedseg's ClientApp in-process: a run whose app names
    another ClientApp is refused."""
    import io
    import zipfile

    from fedseg.engine.flower.executor import CLIENT_APP, check_app

    def fab(pyproject: str) -> bytes:
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as z:
            z.writestr("pyproject.toml", pyproject)
        return buf.getvalue()

    ours = app_pyproject(make_config(federation), FlowerSettings(run_dir=tmp_path))
    check_app(fab(ours))
    with pytest.raises(ValueError, match="runs only fedseg's ClientApp"):
        check_app(fab(ours.replace(CLIENT_APP, "someone.else:app")))


def test_min_replies_defaults_to_a_majority():
    st = FlowerSettings(run_dir=Path("x"))
    assert [st.min_replies(n) for n in (1, 2, 3, 4, 5)] == [1, 2, 2, 3, 3]
    assert FlowerSettings(run_dir=Path("x"), min_sites=9).min_replies(3) == 3


def test_split_federation_gives_each_site_only_its_own_data(federation: Path, tmp_path: Path):
    folders = split_federation(federation, tmp_path / "out")
    assert set(folders) == {"A", "B"}
    fed = FederatedDataset.open(folders["B"])
    assert fed.site_names == ["B"]
    assert not (folders["B"] / "sites" / "A").exists()
    full = FederatedDataset.open(federation).load("B", "train", "weak")
    own = fed.load("B", "train", "weak")
    torch.testing.assert_close(own.labels, full.labels)
    check_site_folder(folders["B"], "B")
    with pytest.raises(DataError, match="unknown site 'A'"):
        check_site_folder(folders["B"], "A")
    with pytest.raises(DataError, match="exists"):
        split_federation(federation, tmp_path / "out")


def test_split_federation_keeps_only_the_sites_own_series_hashes(federation: Path, tmp_path: Path):
    """A DICOM import's manifest lists each site's hashed series: a site's folder must not
    carry the other sites' (they would tell it what the others hold)."""

    root = tmp_path / "fed"
    shutil.copytree(federation, root)
    manifest = root / "manifest.json"
    raw = json.loads(manifest.read_text())
    raw["series"] = {"A": ["a" * 64], "B": ["b" * 64]}
    manifest.write_text(json.dumps(raw))
    folders = split_federation(root, tmp_path / "out")
    assert FederatedDataset.open(folders["B"]).manifest.series == {"B": ["b" * 64]}
    assert FederatedDataset.open(folders["A"]).manifest.series == {"A": ["a" * 64]}


def test_certificates_chain_to_the_ca_and_node_keys_load(tmp_path: Path):
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import (
        load_ssh_private_key,
        load_ssh_public_key,
    )

    files = write_certificates(tmp_path, ["127.0.0.1", "fl.example.org"])
    ca = x509.load_pem_x509_certificate(files.ca.read_bytes())
    cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
    cert.verify_directly_issued_by(ca)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["fl.example.org"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert files.key.stat().st_mode & 0o077 == 0
    key, pub = write_node_key(tmp_path / "keys" / "A")
    private = load_ssh_private_key(key.read_bytes(), None)
    assert isinstance(private, ec.EllipticCurvePrivateKey) and private.curve.name == "secp384r1"
    assert load_ssh_public_key(pub.read_bytes()) == private.public_key()


def test_privacy_table_counts_match_the_partitions():
    rows = {r["method"]: r for r in privacy_rows()}
    assert set(rows) >= {"fedavg", "fedbn", "local", "centralized"}
    from fedseg.engine.flower.privacy import reference_spec

    spec = reference_spec()
    for name in ("fedavg", "fedbn", "local"):
        cls = get_method(name)
        method = cls(cls.Config(), spec)
        params = method.parts(method.build_model()).params()
        assert (rows[name]["upload"], rows[name]["download"]) == (
            params["upload"],
            params["download"],
        )
    assert rows["fedavg"]["upload"] == 1_813_474 and rows["fedavg"]["private"] == 0
    assert rows["fedbn"]["private"] == 2_944 and "without BN" in rows["fedbn"]["uploads"]
    assert rows["local"]["uploads"] == "nothing" and rows["local"]["upload"] == 0
    assert "not federated" in rows["centralized"]["note"]


def test_privacy_table_replaces_only_the_marked_block(tmp_path: Path):
    doc = tmp_path / "d.md"
    doc.write_text("intro\n<!-- privacy-table:start -->\nold\n<!-- privacy-table:end -->\nend\n")
    update_markdown(doc, privacy_table(pattern="fedavg"))
    text = doc.read_text()
    assert text.startswith("intro\n") and text.endswith("end\n") and "old" not in text
    assert "| fedavg | encoder.blocks, decoder.ups, decoder.head | 1,813,474 |" in text
    plain = tmp_path / "plain.md"
    plain.write_text("no markers\n")
    with pytest.raises(FedsegError, match="markers"):
        update_markdown(plain, "x")


def test_cli_commands(federation: Path, tmp_path: Path):
    runner = CliRunner()
    res = runner.invoke(flower_cli, ["privacy-table", "fedbn"])
    assert res.exit_code == 0 and "| fedbn |" in res.output
    res = runner.invoke(flower_cli, ["split-data", str(federation), str(tmp_path / "split")])
    assert res.exit_code == 0 and (tmp_path / "split/A/manifest.json").is_file()
    res = runner.invoke(flower_cli, ["certs", str(tmp_path / "tls"), "--site-key", "A"])
    assert res.exit_code == 0 and (tmp_path / "tls/keys/A.pub").is_file()
    res = runner.invoke(
        flower_cli,
        [
            "site",
            "--name",
            "Z",
            "--data",
            str(federation),
            "--superlink",
            "127.0.0.1:1",
            "--insecure",
        ],
    )
    assert res.exit_code == 2 and "unknown site 'Z'" in res.output
    res = runner.invoke(
        flower_cli, ["site", "--name", "A", "--data", str(federation), "--superlink", "x:1"]
    )
    assert res.exit_code == 2 and "--root-certificates" in res.output
    cfg = tmp_path / "c.yaml"
    cfg.write_text(json.dumps(make_config(federation).model_dump(mode="json")))
    res = runner.invoke(flower_cli, ["server", str(cfg), "--superlink", "127.0.0.1:1"])
    assert res.exit_code == 2 and "--insecure" in res.output


def test_deployment_doc_privacy_table_is_current():
    """docs/deployment.md must list every registered method with current counts; regenerate
    with `fedseg flower privacy-table --write docs/deployment.md`."""
    doc = (Path(__file__).parents[2] / "docs" / "deployment.md").read_text()
    assert privacy_table() in doc
