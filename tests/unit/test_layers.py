"""Every import points down: the layers are read from the source, not from a convention.

``core/`` and ``ledger/`` are the pure layers (no Airflow, no SDK, nothing above them). The
emulator (``batch_emulator``, a package beside the provider) keeps its own knowledge of each
provider, so a bug in an adapter cannot hide behind the emulator sharing the same code; and the
provider never needs the emulator to run.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Sequence
from dataclasses import dataclass
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
    return [found for node in ast.walk(tree) for found in imported_modules_of(node, path, top)]


def imported_modules_of(node: ast.AST, path: Path, top: Path) -> list[tuple[int, str]]:
    """Return (line, absolute module name) for each name the import ``node`` imports (none if it is
    not an import).

    :param node: a node of the module's tree
    :param path: the module
    :param top: the folder holding the package
    """
    found: list[tuple[int, str]] = []
    if isinstance(node, ast.Import):
        found.extend((node.lineno, alias.name) for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            package = ".".join(path.relative_to(top).with_suffix("").parts[:-1])
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


# -- the import contract: the layers of DESIGN.md, no circle ------------------------------------

#: The layers, top first. A module imports modules of its own layer and of the layers below it,
#: never of one above (the names are the package's top-level modules and sub-packages; ``""`` is
#: the package's ``__init__``). ``docs/architecture.md`` draws the same picture.
LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    ("the command line and the UI", frozenset({"cli", "cli_commands", "plugins", "gpu_planner"})),
    ("the task group", frozenset({"pipeline", "prompt_path"})),
    (
        "Airflow glue",
        frozenset({"operators", "sensors", "triggers", "sinks", "links", "task_glue"}),
    ),
    # notifications: the alerts' event shape (a service builds it) and the notifier Airflow calls,
    # imported only when a notifier is made
    (
        "services and connections",
        frozenset({"services", "hooks", "staging", "settings", "metrics", "notifications"}),
    ),
    # get_provider_info: built from the adapters' registry entries (adapters/entries.py)
    ("adapters and the ledger", frozenset({"adapters", "ledger", "get_provider_info"})),
    ("core", frozenset({"core", "exceptions", ""})),
)
#: Imports that the layer order allows and the design does not: (an importer's top-level name, the
#: top-level names it never imports, why).
FORBIDDEN: tuple[tuple[str, frozenset[str], str], ...] = (
    (
        "core",
        frozenset(n for _, names in LAYERS for n in names) - {"core", "exceptions"},
        "core imports nothing of the package but itself and exceptions.py",
    ),
    ("ledger", frozenset({"adapters"}), "the ledger and the adapters know nothing of each other"),
    ("adapters", frozenset({"ledger"}), "the ledger and the adapters know nothing of each other"),
    (
        "services",
        frozenset({"hooks"}),
        "services work without Airflow: the task glue turns connections into clients and hands them in",
    ),
    (
        "hooks",
        frozenset({"services"}),
        "a hook turns a connection into a client and nothing else; what a task does is a service",
    ),
    ("sensors", frozenset({"operators"}), "sensors never import operators: what both need is a service"),
    ("operators", frozenset({"sensors"}), "operators never import sensors: what both need is a service"),
    (
        "triggers",
        frozenset({"operators", "sensors", "services", "ledger"}),
        "a trigger polls a status and nothing else",
    ),
)
#: Layers that import no Airflow (directly; what they are handed may be Airflow's).
NO_AIRFLOW = ("core", "ledger", "adapters", "services")

#: Known violations, each with why it is still there: (importer module, imported module) -> the
#: move that removes it. An entry that no longer happens fails the contract, so it cannot outlive
#: its fix. None is left: the last, hooks/sources.py -> services/, went when read_sql_source moved
#: beside its one caller in operators/sources.py.
ALLOWED: dict[tuple[str, str], str] = {}


@dataclass(frozen=True)
class Import:
    """One import of the package's own code: who imports what, where, and when it runs.

    :param importer: the importing module (``airflow_batch_provider.`` left off)
    :param imported: the module it imports (the longest module prefix of the name)
    :param path: the importing file, relative to the repository
    :param line: the line of the import
    :param runs: ``False`` for an import under ``if TYPE_CHECKING:`` (it never runs)
    """

    importer: str
    imported: str
    path: str
    line: int
    runs: bool


def module_names(package: Path) -> dict[str, Path]:
    """Map each module of ``package`` (``""`` for its ``__init__``, ``hooks`` for a sub-package's)
    to its file.

    :param package: the package folder
    """
    names: dict[str, Path] = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _type_checking_nodes(tree: ast.Module) -> set[int]:
    hidden: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            hidden.update(id(inner) for part in node.body for inner in ast.walk(part))  # not its else
    return hidden


@functools.cache
def package_imports(package: Path = PACKAGE) -> tuple[Import, ...]:
    """Every import of the package's own modules by the package, lazy and type-only ones included.

    :param package: the package folder
    """
    names = module_names(package)

    def resolve(dotted: str) -> str | None:
        if dotted != ROOT and not dotted.startswith(ROOT + "."):
            return None
        name = dotted[len(ROOT) + 1 :]
        while name not in names:
            if not name:
                return None
            name = name.rpartition(".")[0]
        return name

    found: list[Import] = []
    for importer, path in names.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        hidden = _type_checking_nodes(tree)
        for node in ast.walk(tree):
            named = imported_modules_of(node, path, package.parent)
            if isinstance(node, ast.ImportFrom):  # ``from pkg import mod`` imports mod, else pkg
                module, aliases = named[0][1], [t for _, t in named[1:]]
                named = [(node.lineno, t if resolve(t) == t[len(ROOT) + 1 :] else module) for t in aliases]
            for _, target in named:
                imported = resolve(target)
                if imported is not None and imported != importer:
                    rel = str(path.relative_to(package.parent))
                    found.append(Import(importer, imported, rel, node.lineno, id(node) not in hidden))
    return tuple(sorted(set(found), key=lambda i: (i.path, i.line, i.imported)))


def layer_of(module: str) -> int | None:
    """The index in :data:`LAYERS` of the module's layer (``None``: in no layer).

    :param module: a module name relative to the package
    """
    top = module.split(".")[0]
    return next((i for i, (_, names) in enumerate(LAYERS) if top in names), None)


def broken_rules(imports: Sequence[Import]) -> list[str]:
    """Each import that points up the layers or breaks a :data:`FORBIDDEN` rule, with the rule.

    :param imports: the package's imports
    """
    bad: list[str] = []
    for imp in imports:
        mine, theirs = layer_of(imp.importer), layer_of(imp.imported)
        if mine is None or theirs is None:
            continue  # the check that every module has a layer names it
        rule = None
        if theirs < mine:
            rule = f"an arrow up: {LAYERS[mine][0]!r} imports {LAYERS[theirs][0]!r}, a layer above it"
        for layer, banned, why in FORBIDDEN:
            if imp.importer.split(".")[0] == layer and imp.imported.split(".")[0] in banned:
                rule = rule or why
        if rule is not None and (imp.importer, imp.imported) not in ALLOWED:
            bad.append(f"{imp.path}:{imp.line}: {imp.importer} imports {imp.imported}: {rule}")
    return bad


def circles(imports: Sequence[Import]) -> list[list[str]]:
    """The import circles among the package's modules (each sorted; only imports that run count).

    A function-level import is a circle's edge as much as a module-level one: both run. An import
    under ``if TYPE_CHECKING:`` never runs and is the type checker's business.

    :param imports: the package's imports
    """
    graph: dict[str, set[str]] = {}
    for imp in imports:
        if imp.runs and (imp.importer, imp.imported) not in ALLOWED:
            graph.setdefault(imp.importer, set()).add(imp.imported)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component: list[str] = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def describe(circle: list[str], imports: Sequence[Import]) -> str:
    """A circle with the imports that close it (``importer:line -> imported``).

    :param circle: the circle's modules
    :param imports: the package's imports
    """
    members = set(circle)
    arrows = [
        f"{i.path}:{i.line} -> {i.imported}"
        for i in imports
        if i.runs and i.importer in members and i.imported in members
    ]
    return f"import circle {' <-> '.join(circle)}: {'; '.join(arrows)}"


def test_every_module_of_the_package_is_in_a_layer() -> None:
    unplaced = sorted(m or "__init__" for m in module_names(PACKAGE) if layer_of(m) is None)
    assert unplaced == [], f"modules in no layer of LAYERS (place each in one): {unplaced}"


def test_no_import_points_up_the_layers_nor_breaks_a_rule_of_the_design() -> None:
    assert broken_rules(package_imports()) == []


def test_the_package_has_no_import_circle_at_module_or_function_level() -> None:
    imports = package_imports()
    assert [describe(c, imports) for c in circles(imports)] == []


def test_each_allowed_violation_still_happens_so_the_list_empties_as_they_are_fixed() -> None:
    seen = {(i.importer, i.imported) for i in package_imports()}
    assert sorted(pair for pair in ALLOWED if pair not in seen) == []


@pytest.mark.parametrize("layer", NO_AIRFLOW)
def test_the_layers_below_the_glue_import_no_airflow(layer: str) -> None:
    assert violations(layer, (), ("airflow",)) == []


def test_the_contract_sees_an_arrow_up_a_broken_rule_and_a_lazy_circle(tmp_path: Path) -> None:
    package = tmp_path / ROOT
    for folder in ("core", "sensors", "operators"):
        (package / folder).mkdir(parents=True)
        (package / folder / "__init__.py").write_text("", encoding="utf-8")
    (package / "core" / "probe.py").write_text(
        "from airflow_batch_provider.hooks import batch\n", encoding="utf-8"
    )
    (package / "sensors" / "probe.py").write_text("from ..operators.probe import f\n", encoding="utf-8")
    (package / "operators" / "probe.py").write_text(
        "def f():\n    from airflow_batch_provider.operators import other\n", encoding="utf-8"
    )
    (package / "operators" / "other.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from airflow_batch_provider.operators.probe import f\n"
        "if TYPE_CHECKING:\n    from airflow_batch_provider.sensors import probe\n",
        encoding="utf-8",
    )
    (package / "hooks").mkdir()
    (package / "hooks" / "batch.py").write_text("", encoding="utf-8")
    imports = package_imports(package)
    assert broken_rules(imports) == [
        f"{ROOT}/core/probe.py:1: core.probe imports hooks.batch: an arrow up: 'core' imports "
        "'services and connections', a layer above it",
        f"{ROOT}/operators/other.py:4: operators.other imports sensors.probe: operators never import "
        "sensors: what both need is a service",
        f"{ROOT}/sensors/probe.py:1: sensors.probe imports operators.probe: sensors never import "
        "operators: what both need is a service",
    ]
    assert [describe(c, imports) for c in circles(imports)] == [
        f"import circle operators.other <-> operators.probe: {ROOT}/operators/other.py:2 -> "
        f"operators.probe; {ROOT}/operators/probe.py:2 -> operators.other"
    ]


#: the house's size rules (issue 22): a module past this is two modules; an ``execute`` past that
#: does the work itself instead of reading as the task's steps over ``services/``
MODULE_LINES_MAX = 800
TASK_METHOD_LINES_MAX = 30  # the body, the docstring not counted
TASK_METHODS = ("execute", "execute_complete", "poke")


def _oversized(package: Path) -> tuple[list[str], list[str]]:
    """The modules over :data:`MODULE_LINES_MAX` lines and the task methods over theirs.

    :param package: the package's folder
    """
    modules, methods = [], []
    for path in sorted(package.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if (lines := text.count("\n")) > MODULE_LINES_MAX:
            modules.append(f"{path.relative_to(package)}: {lines} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and item.name in TASK_METHODS:
                        body = item.body[1:] if ast.get_docstring(item) is not None else item.body
                        length = (item.end_lineno or item.lineno) - body[0].lineno + 1 if body else 0
                        if length > TASK_METHOD_LINES_MAX:
                            methods.append(
                                f"{path.relative_to(package)}: {node.name}.{item.name} {length} lines"
                            )
    return modules, methods


def test_no_module_of_the_package_passes_800_lines_and_no_task_method_does_the_work_itself() -> None:
    modules, methods = _oversized(PACKAGE)
    assert not modules, f"split these modules in two (at most {MODULE_LINES_MAX} lines): {modules}"
    assert not methods, (
        f"move the work of these into services/ (at most {TASK_METHOD_LINES_MAX} lines): {methods}"
    )


#: the repository's other Python, held to the same module size: the emulator, the tests and their
#: support, the benchmarks, the scripts, the DAGs and what they include
OTHER_CODE = ("batch_emulator", "benchmarks", "dags", "include", "plugins", "scripts", "tests")


def test_no_module_of_the_emulator_tests_benchmarks_scripts_or_dags_passes_800_lines() -> None:
    modules = [f"{folder}/{module}" for folder in OTHER_CODE for module in _oversized(REPO / folder)[0]]
    assert not modules, f"split these modules in two (at most {MODULE_LINES_MAX} lines): {modules}"


def test_the_size_scan_sees_a_long_module_and_a_long_execute(tmp_path: Path) -> None:
    body = "\n".join(f"        x{i} = {i}" for i in range(TASK_METHOD_LINES_MAX + 1))
    short = "\n".join(f"        y{i} = {i}" for i in range(TASK_METHOD_LINES_MAX))
    (tmp_path / "op.py").write_text(
        f"class Op:\n    def execute(self, context):\n{body}\n\n"
        f'    def poke(self, context):\n        """A docstring\n\n        not counted.\n        """\n{short}\n',
        encoding="utf-8",
    )
    (tmp_path / "big.py").write_text("x = 1\n" * (MODULE_LINES_MAX + 1), encoding="utf-8")
    modules, methods = _oversized(tmp_path)
    assert modules == [f"big.py: {MODULE_LINES_MAX + 1} lines"]
    assert methods == [f"op.py: Op.execute {TASK_METHOD_LINES_MAX + 1} lines"]


def modules_without_a_test_module(package: Path, tests: Path) -> list[str]:
    """The modules of ``package`` with no ``tests/<folder>/test_<name>.py`` of their own.

    :param package: the package's folder
    :param tests: the folder its unit tests mirror
    """
    missing = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package)
        if path.name != "__init__.py" and not (tests / relative.parent / f"test_{path.name}").exists():
            missing.append(relative.as_posix())
    return missing


def test_every_module_of_the_package_has_its_own_test_module() -> None:
    missing = modules_without_a_test_module(PACKAGE, REPO / "tests" / "unit")
    assert not missing, f"give these a test module (tests/unit/<folder>/test_<name>.py): {missing}"


def test_the_test_module_scan_sees_a_module_without_one(tmp_path: Path) -> None:
    (tmp_path / "pkg" / "rooms").mkdir(parents=True)
    (tmp_path / "tests" / "rooms").mkdir(parents=True)
    for name in ("__init__.py", "rooms/__init__.py", "rooms/tested.py", "rooms/untested.py"):
        (tmp_path / "pkg" / name).write_text("")
    (tmp_path / "tests" / "rooms" / "test_tested.py").write_text("")
    assert modules_without_a_test_module(tmp_path / "pkg", tmp_path / "tests") == ["rooms/untested.py"]
