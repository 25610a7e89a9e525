"""A repository script (a benchmark, a data generator) loaded as a module from its path, as the tests use it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_script(path: Path, name: str | None = None) -> ModuleType:
    """Load the script at ``path`` as a module.

    The module is registered in :data:`sys.modules` (a dataclass looks its module up there while
    its class is made), and the script's folder is on :data:`sys.path` while it runs (a benchmark
    imports its sibling ``common``).

    :param path: the script
    :param name: the module's name (default: the file's stem, prefixed so it shadows no real module)
    """
    name = name or f"abp_script_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    folder = str(path.parent)
    added = folder not in sys.path
    if added:
        sys.path.insert(0, folder)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    finally:
        if added:
            sys.path.remove(folder)
    return module
