"""A helpdesk on loopback that records every request it gets, by its ``Idempotency-Key`` header.

The consumer DAG tests' external system: ``POST /escalations`` answers 201 and keeps the request
(its key, its JSON body), in the order received, so that a test can count how often each key came.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.support.ports import LOOPBACK


@dataclass
class Helpdesk:
    """What the helpdesk was asked: one ``(key, body)`` per request, and its address."""

    port: int = 0
    requests: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def connection(self) -> dict[str, Any]:
        """The ``http`` Airflow connection that points at it."""
        return {"conn_type": "http", "host": LOOPBACK, "port": self.port, "schema": "http"}

    def keys(self) -> Counter[str]:
        """How many requests came with each ``Idempotency-Key``."""
        with self.lock:
            return Counter(key for key, _ in self.requests)

    def tickets_by_key(self) -> dict[str, str]:
        """The ticket id each key was sent for (the last request's)."""
        with self.lock:
            return {key: str(body["ticket_id"]) for key, body in self.requests}


@contextmanager
def serve_helpdesk() -> Iterator[Helpdesk]:
    """Serve a :class:`Helpdesk` on a free loopback port until the block ends."""
    desk = Helpdesk()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            if self.path != "/escalations" or not self.headers.get("Idempotency-Key"):
                self.send_response(400)
                self.end_headers()
                return
            with desk.lock:
                desk.requests.append((self.headers["Idempotency-Key"], body))
            self.send_response(201)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"status": "opened"}')

        def log_message(self, format: str, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer((LOOPBACK, 0), Handler)
    desk.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield desk
    finally:
        server.shutdown()
        server.server_close()
