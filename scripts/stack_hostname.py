"""``[core] hostname_callable`` of the Celery form's workers: each names itself (``worker-1``...).

Both run on one machine, so the machine's name would not tell their task instances apart.
"""

from __future__ import annotations

import os
import socket


def hostname() -> str:
    """``$ABP_STACK_WORKER``, else the machine's name."""
    return os.environ.get("ABP_STACK_WORKER") or socket.getfqdn()
