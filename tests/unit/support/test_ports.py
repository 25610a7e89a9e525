from __future__ import annotations

import socket

from tests.support.ports import LOOPBACK, free_port, is_listening


def test_a_free_port_can_be_bound_on_loopback() -> None:
    port = free_port()
    assert 1024 <= port <= 65535
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, port))


def test_is_listening_tells_a_listening_port_from_a_closed_one() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert is_listening(port)
    assert not is_listening(port)
