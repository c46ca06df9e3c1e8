"""The port a worker offers for the next rendezvous (``spare_port``) is free on every address of the node.

torchrun's store (torch's TCPStore) listens on all addresses, so a port that some other socket holds on another
address, such as the local port of any client connection over 127.0.0.1, is taken for it even though a bind on the
worker's own address succeeds: a launch on such a port failed with EADDRINUSE (seen on the loopback Slurm, whose
pilots have addresses 127.0.0.1N beside the machine's 127.0.0.1 traffic)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from hpcsched.runtime import hostaddr


@pytest.fixture
def client_port() -> Iterator[int]:
    """The local port of a live client connection over 127.0.0.1 (the kernel's ephemeral choice)."""
    with socket.socket() as srv, socket.socket() as c:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        c.connect(srv.getsockname())
        a, _ = srv.accept()
        with a:
            yield c.getsockname()[1]


def test_a_port_a_client_holds_on_another_address_is_taken_for_a_listener_on_all(client_port: int) -> None:
    """Why the check binds the wildcard: the worker's own address says free, a listener on all says in use."""
    with socket.socket() as s:
        s.bind(("127.0.0.2", client_port))  # another loopback address: no conflict there
    with socket.socket() as s, pytest.raises(OSError) as taken:
        s.bind(("", client_port))
    assert taken.value.errno == 98  # EADDRINUSE


def test_spare_port_checks_every_address(monkeypatch: pytest.MonkeyPatch, client_port: int) -> None:
    bound: list[tuple] = []
    real = socket.socket

    class Recording(real):  # the real socket, its bind address recorded
        def bind(self, address: tuple) -> None:
            bound.append(address)
            super().bind(address)

    monkeypatch.setattr(hostaddr.socket, "socket", Recording)
    port = hostaddr.spare_port("127.0.0.11")
    assert bound == [("", 0)]
    assert port != client_port
    with real() as s:  # and a listener on every address can have it
        s.bind(("", port))
