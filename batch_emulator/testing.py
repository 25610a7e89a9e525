"""Run the emulator in a background thread on a free loopback port (for tests and fixtures)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from batch_emulator.config import EmulatorConfig


@contextmanager
def run_emulator(
    config: EmulatorConfig | None = None, *, startup_timeout_s: float = 10.0, **app_kwargs: Any
) -> Iterator[str]:
    """Serve the emulator with uvicorn in a daemon thread and yield its base URL.

    The socket is bound before the server starts, on ``config.host`` and a free port (the
    configured port is ignored), so parallel tests never race for a port. The OpenAI SDK's
    ``base_url`` is the yielded URL plus ``/v1``. On exit the server shuts down and the thread is
    joined.

    :param config: emulator settings (default :class:`EmulatorConfig`)
    :param startup_timeout_s: give up when the server is not up by then
    :param app_kwargs: passed to :func:`~batch_emulator.app.create_app`
    :return: ``http://127.0.0.1:<port>``
    """
    import uvicorn

    from batch_emulator.app import create_app

    config = config or EmulatorConfig()
    bind_host = config.host.strip("[]")
    family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((bind_host, 0))
    port = sock.getsockname()[1]
    config = replace(config, port=port)
    app = create_app(config, **app_kwargs)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name=f"emulator-{port}", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + startup_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            sock.close()
            raise RuntimeError(
                f"the emulator did not start on {config.host}:{port} within {startup_timeout_s}s"
            )
        time.sleep(0.01)
    host = f"[{bind_host}]" if ":" in bind_host else bind_host
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
