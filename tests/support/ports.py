"""Free TCP ports on the loopback interface."""

from __future__ import annotations

import socket

LOOPBACK = "127.0.0.1"


def free_port(host: str = LOOPBACK) -> int:
    """Return a TCP port on ``host`` that nothing listens on right now.

    The port is found by binding to port 0 and letting the kernel choose; the socket is closed before
    returning, so a tiny race with other processes remains. Callers that start a server on it should
    retry on "address in use".

    :param host: the interface address to probe, loopback by default.
    :return: a port number between 1024 and 65535.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def is_listening(port: int, host: str = LOOPBACK, timeout: float = 0.2) -> bool:
    """Tell whether something accepts TCP connections on ``host:port``.

    :param port: the TCP port.
    :param host: the address to connect to.
    :param timeout: seconds to wait for the connection.
    :return: ``True`` when a connection was accepted.
    """
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False
