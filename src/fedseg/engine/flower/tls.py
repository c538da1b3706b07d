"""Certificates and SuperNode keys for pilots and tests (production sites use their own PKI).

* :func:`write_certificates`: a private CA and a SuperLink certificate for the given hosts
  (``flower-superlink --ssl-ca-certfile ca.crt --ssl-certfile server.pem --ssl-keyfile
  server.key``; sites pass ``--root-certificates ca.crt``).
* :func:`write_node_key`: a SuperNode's EC P-384 key pair in OpenSSH format; the coordinator
  registers the public key (``flwr supernode register key.pub <superlink> --name <site>``),
  the site keeps the private key (``flower-supernode --auth-supernode-private-key key``).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

__all__ = ["TlsFiles", "write_certificates", "write_node_key"]


@dataclass(frozen=True)
class TlsFiles:
    """Paths of the CA certificate and of the SuperLink's certificate and private key."""

    ca: Path
    cert: Path
    key: Path


def _private(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    os.chmod(path, 0o600)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def write_certificates(
    out: Path, hosts: Sequence[str] = ("127.0.0.1", "localhost"), days: int = 365
) -> TlsFiles:
    """Write ``ca.crt``, ``server.pem`` and ``server.key`` (valid for ``hosts``) into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedseg federation CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP384R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName([_san(h) for h in hosts]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    files = TlsFiles(out / "ca.crt", out / "server.pem", out / "server.key")
    files.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _private(files.key, _pem_key(key))
    _private(out / "ca.key", _pem_key(ca_key))
    return files


def write_node_key(path: Path) -> tuple[Path, Path]:
    """Write a SuperNode key pair: ``path`` (private, OpenSSH) and ``path.pub``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    _private(
        path,
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        ),
    )
    pub = path.with_name(path.name + ".pub")
    pub.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )
    )
    return path, pub
