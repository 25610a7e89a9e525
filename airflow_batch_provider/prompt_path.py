"""Where a DAG's ``prompt="relative/path.yaml"`` is: beside the DAG file, checked when it is parsed.

A relative path is resolved against the folder of the DAG file that builds the group (Airflow's
``DAG.folder``), not the worker's working directory, so a DAG runs the same from any folder; a
path that names no file fails when the DAG file is parsed, not when ``prepare`` runs.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from airflow_batch_provider.core.names import is_templated
from airflow_batch_provider.exceptions import ConfigurationError


def dag_folder() -> Path | None:
    """The folder of the DAG being defined (its ``fileloc``), or of the calling file outside a DAG."""
    try:
        from airflow.sdk.definitions._internal.contextmanager import DagContext

        dag = DagContext.get_current()
    except ImportError:  # pragma: no cover - a future SDK that moves it: fall back to the caller
        dag = None
    fileloc = getattr(dag, "fileloc", None)
    if fileloc:
        return Path(fileloc).resolve().parent
    package = Path(__file__).resolve().parent
    for frame in inspect.stack(context=0)[1:]:
        caller = Path(frame.filename).resolve()
        if package not in caller.parents and caller.is_file():
            return caller.parent
    return None


def resolve_prompt_path(prompt: Any, *, base: Path | None = None) -> Any:
    """Return ``prompt`` with a relative file path made absolute against the DAG file's folder.

    Anything that is not a path (a ``PromptTemplate``, a callable, a template, a URL) is returned
    as it is.

    :param prompt: the ``prompt=`` of a DAG
    :param base: the folder a relative path is resolved against (default: the DAG file's)
    :raises ConfigurationError: the path names no file
    """
    if not isinstance(prompt, str | Path):
        return prompt
    text = str(prompt)
    if "://" in text or is_templated(text):
        return prompt
    path = Path(text).expanduser()
    if not path.is_absolute():
        folder = base if base is not None else dag_folder()
        path = (folder or Path.cwd()) / path
    if not path.is_file():
        raise ConfigurationError(
            f"prompt={text!r}: no file at {path}. A relative prompt path is resolved against the folder "
            "of the DAG file; put the prompt YAML there (the README's quick start shows one) or give an "
            "absolute path."
        )
    return str(path)
