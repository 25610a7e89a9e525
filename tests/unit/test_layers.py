"""Every import points down: the layers are read from the source, not from a convention.

``core/`` and ``ledger/`` are the pure layers (no Airflow, no SDK, nothing above them). The
emulator (``batch_emulator``, a package beside the provider) keeps its own knowledge of each
provider, so a bug in an adapter cannot hide behind the emulator sharing the same code; and the
provider never needs the emulator to run.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "airflow_batch_provider"
ROOT = "airflow_batch_provider"
EMULATOR = REPO / "batch_emulator"

#: Packages of this distribution that sit above ``core``/``ledger``.
UPPER = (
    "adapters",
    "hooks",
    "operators",
    "sensors",
    "triggers",
    "services",
    "plugins",
    "kubernetes",
    "pipeline",
    "sinks",
)
#: Third-party packages the pure layers never import (Airflow and the provider SDKs).
FOREIGN = (
    "airflow",
    "openai",
    "anthropic",
    "google",
    "boto3",
    "botocore",
    "aiobotocore",
    "kubernetes",
)


def imported_modules(path: Path, top: Path) -> list[tuple[int, str]]:
    """Return (line, absolute module name) for every import in ``path``, lazy ones included.

    :param path: a module of the package
    :param top: the folder holding the package
    """
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = ".".join(path.relative_to(top).with_suffix("").parts[:-1])
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            found.append((node.lineno, module))
            # ``from airflow_batch_provider import adapters`` names the layer in the alias
            found.extend((node.lineno, f"{module}.{alias.name}") for alias in node.names)
    return found


def violations(
    layer: str,
    banned_internal: tuple[str, ...],
    banned_foreign: tuple[str, ...],
    package: Path = PACKAGE,
) -> list[str]:
    """List ``file:line -> module`` for each import of ``layer`` that points up or outside.

    :param layer: a sub-package of the distribution (``core``, ``ledger``, ``emulator``)
    :param banned_internal: sub-packages of the distribution it must not import
    :param banned_foreign: top-level third-party packages it must not import
    :param package: the package folder to scan
    """
    bad: list[str] = []
    for path in sorted((package / layer).rglob("*.py")):
        for line, module in imported_modules(path, package.parent):
            internal = module.startswith(ROOT + ".") and module.split(".")[1] in banned_internal
            foreign = module.split(".")[0] in banned_foreign
            if internal or foreign:
                bad.append(f"{path.relative_to(package.parent)}:{line} -> {module}")
    return bad


@pytest.mark.parametrize("layer", ["core", "ledger"])
def test_the_pure_layers_import_nothing_above_them_nor_airflow_nor_an_sdk(layer: str) -> None:
    assert violations(layer, UPPER, FOREIGN) == []


def test_the_scan_sees_an_upward_import_a_relative_one_and_a_lazy_one(tmp_path: Path) -> None:
    package = tmp_path / ROOT
    (package / "core").mkdir(parents=True)
    (package / "core" / "probe.py").write_text(
        "from airflow_batch_provider.adapters.base import Limits\n"
        "from ..hooks import batch\n"
        "def f():\n"
        "    import airflow.models\n",
        encoding="utf-8",
    )
    found = violations("core", UPPER, FOREIGN, package)
    assert [v.split(" -> ")[1] for v in found] == [
        "airflow_batch_provider.adapters.base",
        "airflow_batch_provider.adapters.base.Limits",
        "airflow_batch_provider.hooks",
        "airflow_batch_provider.hooks.batch",
        "airflow.models",
    ]


def imports_of(package: Path, banned_roots: tuple[str, ...]) -> list[str]:
    """List ``file:line -> module`` for each import in ``package`` whose top-level name is banned.

    :param package: a top-level package folder (``airflow_batch_provider``, ``batch_emulator``)
    :param banned_roots: top-level module names it must not import
    """
    return [
        f"{path.relative_to(package.parent)}:{line} -> {module}"
        for path in sorted(package.rglob("*.py"))
        for line, module in imported_modules(path, package.parent)
        if module.split(".")[0] in banned_roots
    ]


def test_the_provider_never_imports_the_emulator() -> None:
    # the emulator is an extra for tests and demos; a deployment runs without it
    assert imports_of(PACKAGE, ("batch_emulator",)) == []


def test_the_emulator_imports_nothing_of_the_provider_nor_airflow() -> None:
    # it keeps its own knowledge of each provider, so it can catch an adapter's mistake
    assert imports_of(EMULATOR, (ROOT, "airflow")) == []


def test_the_package_scan_sees_a_stray_import_either_way(tmp_path: Path) -> None:
    emulator = tmp_path / "batch_emulator"
    emulator.mkdir()
    (emulator / "probe.py").write_text(
        "def f():\n    from airflow_batch_provider.adapters.bedrock import model_family\n", encoding="utf-8"
    )
    provider = tmp_path / ROOT / "hooks"
    provider.mkdir(parents=True)
    (provider / "probe.py").write_text("import batch_emulator.testing\n", encoding="utf-8")
    assert imports_of(emulator, (ROOT, "airflow")) == [
        "batch_emulator/probe.py:2 -> airflow_batch_provider.adapters.bedrock",
        "batch_emulator/probe.py:2 -> airflow_batch_provider.adapters.bedrock.model_family",
    ]
    assert imports_of(tmp_path / ROOT, ("batch_emulator",)) == [
        "airflow_batch_provider/hooks/probe.py:1 -> batch_emulator.testing"
    ]


def test_configuration_is_read_through_the_compat_layer_as_providers_must() -> None:
    # Airflow's provider rule: ``airflow.configuration`` is core's; a provider reads its options
    # (and Airflow's) through ``airflow.providers.common.compat.sdk.conf`` in workers and servers alike
    direct = [
        f"{path.relative_to(REPO)}:{line} -> {module}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for line, module in imported_modules(path, REPO)
        if module == "airflow.configuration" or module.startswith("airflow.configuration.")
    ]
    assert direct == []
