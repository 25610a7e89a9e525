"""``python -m batch_emulator``: serve the emulator on a loopback address."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from batch_emulator.config import DEFAULT_PORT, EmulatorConfig, is_loopback
from batch_emulator.faults import FaultConfig


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m batch_emulator",
        description="Local LLM batch provider emulator (OpenAI-compatible). Binds loopback addresses only.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="loopback address to bind (default 127.0.0.1)")
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"TCP port, 0 for any (default {DEFAULT_PORT})"
    )
    parser.add_argument(
        "--time-scale", type=float, default=1.0, help="multiplier on phase durations (default 1.0)"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of every deterministic decision (default 0)"
    )
    parser.add_argument("--faults", type=Path, help="JSON file of fault settings (see FaultConfig)")
    parser.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="one fault setting, e.g. rate_500=0.05 or expire_batches=[0,2]; repeatable; wins over --faults",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        help="where files, batch items and results are kept (default: a temporary folder removed at exit)",
    )
    parser.add_argument(
        "--max-batch-requests",
        type=int,
        default=EmulatorConfig.max_batch_requests,
        help="most request lines in one OpenAI batch input file (default 50,000, the API's limit)",
    )
    parser.add_argument(
        "--max-batch-bytes",
        type=int,
        default=EmulatorConfig.max_batch_bytes,
        help="largest OpenAI batch input file in bytes (default 200 MiB, the API's limit)",
    )
    parser.add_argument("--api-key", help="require this bearer token (default: accept any)")
    parser.add_argument(
        "--s3-endpoint", help="S3-compatible endpoint URL for the Bedrock routes' input and output"
    )
    parser.add_argument(
        "--gcs-endpoint", help="GCS JSON API endpoint for the Vertex AI routes' input and output"
    )
    parser.add_argument("--log-level", default="warning", help="uvicorn log level (default warning)")
    return parser.parse_args(argv)


def _fault_value(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def build_config(args: argparse.Namespace) -> EmulatorConfig:
    """Turn command-line arguments into an :class:`EmulatorConfig`.

    :param args: the parsed arguments
    :raises ValueError: invalid host, fault or value
    """
    if not is_loopback(args.host):
        raise ValueError(
            f"--host {args.host!r} is not a loopback address; the emulator only binds to this machine "
            "(use 127.0.0.1, ::1 or localhost)."
        )
    settings: dict[str, Any] = {}
    if args.faults is not None:
        loaded = json.loads(args.faults.read_text(encoding="utf-8"))
        if not isinstance(loaded, dict):
            raise ValueError(f"{args.faults} must hold a JSON object of fault settings.")
        settings.update(loaded)
    for item in args.fault:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--fault {item!r} is not KEY=VALUE.")
        settings[key.strip()] = _fault_value(value.strip())
    return EmulatorConfig(
        host=args.host,
        port=args.port,
        time_scale=args.time_scale,
        seed=args.seed,
        faults=FaultConfig.from_mapping(settings),
        data_dir=args.data_dir,
        max_batch_requests=args.max_batch_requests,
        max_batch_bytes=args.max_batch_bytes,
        max_file_bytes=max(EmulatorConfig.max_file_bytes, args.max_batch_bytes),
        api_key=args.api_key,
        s3_endpoint=args.s3_endpoint,
        gcs_endpoint=args.gcs_endpoint,
    )


async def _serve(config: EmulatorConfig, log_level: str) -> None:
    import uvicorn

    from batch_emulator.app import create_app

    bind_host = config.host.strip("[]")
    family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((bind_host, config.port))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(config), log_level=log_level, lifespan="off"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started and not task.done():
        await asyncio.sleep(0.01)
    if server.started:
        host = f"[{bind_host}]" if ":" in bind_host else bind_host
        print(f"emulator listening on http://{host}:{port}", flush=True)
    await task


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the emulator until interrupted; return the exit status.

    :param argv: arguments (default ``sys.argv[1:]``)
    """
    args = _parse_args(argv)
    try:
        config = build_config(args)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # uvicorn stops on SIGTERM and then raises it again; its default action would end the process
    # before the temporary data directory (no --data-dir) is removed at exit: exit normally instead
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        asyncio.run(_serve(config, args.log_level))
    except KeyboardInterrupt:
        pass
    except OSError as exc:
        print(f"error: cannot listen on {config.host}:{config.port}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
