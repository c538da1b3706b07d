"""Test-wide fixtures: no network, quiet thread pools, a temporary nilearn data dir."""

from __future__ import annotations

import socket

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _no_network(
    monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest, tmp_path_factory
) -> None:
    """Refuse connections to anything but loopback (Flower tests use 127.0.0.1 only)."""
    monkeypatch.setenv("NILEARN_DATA", str(tmp_path_factory.getbasetemp() / "nilearn"))
    real = socket.socket.connect

    def guarded(self: socket.socket, address: object) -> object:
        host = address[0] if isinstance(address, tuple) else str(address)
        if (
            isinstance(host, str)
            and not (host.startswith("127.") or host in ("localhost", "::1"))
            and self.family in (socket.AF_INET, socket.AF_INET6)
        ):
            raise RuntimeError(f"tests must not use the network (connect to {address})")
        return real(self, address)

    monkeypatch.setattr(socket.socket, "connect", guarded)
