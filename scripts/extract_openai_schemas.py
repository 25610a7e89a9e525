"""Write the OpenAI component schemas the emulator serves into tests/unit/batch_emulator/schemas/.

The tests validate every emulator reply against these schemas, so a clone needs nothing outside
itself. The schemas are copied, with everything they reference, from the official OpenAI OpenAPI
description (MIT licence), whose path is the only argument:

    .venv/bin/python scripts/extract_openai_schemas.py path/to/openai-openapi.yaml

Run it again when the emulator serves a new object, and commit the result.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

ROOTS = (
    "OpenAIFile",
    "ListFilesResponse",
    "DeleteFileResponse",
    "Batch",
    "ListBatchesResponse",
    "CreateChatCompletionResponse",
    "CreateEmbeddingResponse",
    "ErrorResponse",
    "CreateResponse",
    "Response",
    "CreateModerationRequest",
    "CreateModerationResponse",
)
OUT = (
    Path(__file__).resolve().parent.parent
    / "tests"
    / "unit"
    / "emulator"
    / "schemas"
    / "openai-components.json"
)


def closure(schemas: dict[str, Any], roots: tuple[str, ...]) -> dict[str, Any]:
    """Return the named schemas and every schema they reference, transitively."""
    found: dict[str, Any] = {}

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "$ref" and isinstance(value, str) and value.startswith("#/components/schemas/"):
                    add(value.rsplit("/", 1)[1])
                else:
                    walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    def add(name: str) -> None:
        if name not in found:
            found[name] = schemas[name]
            walk(schemas[name])

    for root in roots:
        add(root)
    return dict(sorted(found.items()))


def main(argv: list[str]) -> int:
    """Extract the schemas from the description named by ``argv[1]``; return the exit status."""
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[1], "rb") as fh:
        document = yaml.load(fh, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    info = document["info"]
    payload = {
        "$comment": (
            f"Copied by scripts/extract_openai_schemas.py from the official OpenAI OpenAPI description "
            f"'{info['title']}' version {info['version']} (licence: {info['license']['name']}): the objects "
            "the emulator serves and everything they reference. Regenerate, do not hand-edit."
        ),
        "openapi_version": info["version"],
        "components": {"schemas": closure(document["components"]["schemas"], ROOTS)},
    }
    OUT.write_text(json.dumps(payload, indent=1, sort_keys=False) + "\n", encoding="utf-8")
    print(f"{OUT}: {len(payload['components']['schemas'])} schemas")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
