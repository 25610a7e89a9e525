"""The package's declared metadata is true: floors are the versions tested, imports are declared."""

from __future__ import annotations

import ast
import re
import sys
import zipfile
from email.message import Message
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.version import Version

from tests.support import floor_env

REPO_ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
# extras that carry the product's own dependencies (not the test tools)
RUNTIME_EXTRAS = {
    "openai",
    "anthropic",
    "gemini",
    "bedrock",
    "kubernetes",
    "s3",
    "vertex",
    "google",
    "postgres",
    "sql",
    "mysql",
    "http",
    "parquet",
    "emulator",
    "openlineage",
}
# development requirements: PEP 735 dependency groups, never published as extras
DEV_GROUPS = {"stack", "test", "test-google", "test-mysql"}


def pins(name: str = "constraints.txt") -> dict[str, Version]:
    found = {}
    for line in (REPO_ROOT / name).read_text(encoding="utf-8").splitlines():
        match = re.match(r"^([A-Za-z0-9_.-]+)==([^\s;]+)", line)
        if match:
            found[_norm(match[1])] = Version(match[2])
    return found


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def runtime_requirements() -> list[Requirement]:
    project = PYPROJECT["project"]
    declared = [Requirement(r) for r in project["dependencies"]]
    for extra, reqs in project["optional-dependencies"].items():
        if extra in RUNTIME_EXTRAS:
            declared += [Requirement(r) for r in reqs]
    # the stack's runtime pieces (asyncpg, the Celery provider) are floors the tests run with too
    declared += [Requirement(r) for r in PYPROJECT["dependency-groups"]["stack"]]
    return declared


def test_every_floor_is_at_or_below_the_pin_that_the_main_suite_runs_with() -> None:
    """Both ends are tested: the pins of constraints.txt (`make test`), constraints-google.txt
    (`make test-google`) or constraints-mysql.txt (`make test-mysql`) from above, the floors
    themselves by `make test-lowest` from below."""
    environments = [pins(), pins("constraints-google.txt"), pins("constraints-mysql.txt")]
    wrong = []
    for req in runtime_requirements():
        if _norm(req.name) == "airflow-batch-provider":
            continue  # an extra that names others (`google` = `vertex` + the Google provider)
        floors = [Version(s.version) for s in req.specifier if s.operator == ">="]
        if not floors:
            wrong.append(f"{req}: no floor")
            continue
        tested = [env[_norm(req.name)] for env in environments if _norm(req.name) in env]
        if not tested:
            wrong.append(
                f"{req}: not pinned in constraints.txt, constraints-google.txt or constraints-mysql.txt"
            )
        elif not any(floors[0] <= pin for pin in tested):
            wrong.append(f"{req}: above every tested pin ({', '.join(map(str, tested))})")
    assert not wrong, "\n".join(wrong)


def test_make_test_lowest_runs_tests_with_every_direct_dependency_at_its_floor() -> None:
    makefile = (REPO_ROOT / "Makefile").read_text(encoding="utf-8")
    assert "\ntest-lowest: venv-lowest " in makefile
    assert "$(BIN)/python -m tests.support.floor_env --lowest $(VENV_LOWEST)" in makefile
    test = makefile.split("\ntest: venv ", 1)[1].split("\n\n", 1)[0]
    assert "$(MAKE) --no-print-directory test-lowest" in test, "`make test` runs the floors' tests"
    tests = re.search(r"^LOWEST_TESTS \?= ((?:.*\\\n)*.*)$", makefile, re.M)
    assert tests, "LOWEST_TESTS names the representative tests"
    for path in tests[1].replace("\\\n", " ").split():
        file = path.split("::", 1)[0]
        assert (REPO_ROOT / file).is_file(), f"LOWEST_TESTS names {file}, which does not exist"


def test_the_google_environment_differs_from_the_main_pins_only_where_the_google_provider_needs_it() -> None:
    """Regenerate one constraints file and not the other, and this says which pins drifted apart."""
    main, google = pins(), pins("constraints-google.txt")
    differ = {name for name in main.keys() & google.keys() if main[name] != google[name]}
    assert differ == {"google-genai", "openai", "importlib-metadata"}, (
        f"pins that differ: {sorted(differ)}; run `make constraints-google` after `make constraints`"
    )
    assert google["google-genai"].major == 2 and main["google-genai"].major == 3
    assert "apache-airflow-providers-google" in google and "apache-airflow-providers-google" not in main


def test_the_google_extra_stays_out_of_all_because_it_cannot_sit_beside_the_openai_extra() -> None:
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert "google" not in extras["all"][0] and "openai" in extras["all"][0]
    makefile = (REPO_ROOT / "Makefile").read_text(encoding="utf-8")
    assert "-e '.[google,gemini,emulator,postgres]' --group test-google" in makefile
    # why `google` is not in `all`: beside it, openai and google-genai stay a major line below the main pins
    google, main = pins("constraints-google.txt"), pins()
    assert google["openai"].major < main["openai"].major
    assert google["google-genai"].major < main["google-genai"].major


def test_the_mysql_extra_stays_out_of_all_and_its_lane_adds_only_the_mysql_provider_to_the_main_pins() -> (
    None
):
    """The MySQL provider requires mysqlclient, built from source (a C compiler and MariaDB's headers):
    `make venv` must not need them; `make test-mysql` (part of `make test`) tests the extra."""
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert "mysql" not in Requirement(extras["all"][0]).extras
    assert [_norm(Requirement(r).name) for r in extras["mysql"]] == [
        "airflow-batch-provider",  # [sql]: common.sql and the hooks the tests also use
        "apache-airflow-providers-mysql",
    ]
    main, mysql = pins(), pins("constraints-mysql.txt")
    differ = {name for name in main.keys() & mysql.keys() if main[name] != mysql[name]}
    assert not differ, (
        f"pins that differ: {sorted(differ)}; run `make constraints-mysql` after `make constraints`"
    )
    assert set(mysql) - set(main) == {
        "apache-airflow-providers-mysql",
        "mysqlclient",
        "mysql-connector-python",
        "pymysql",
        "aiomysql",
    }
    makefile = (REPO_ROOT / "Makefile").read_text(encoding="utf-8")
    assert "-c constraints-mysql.txt -e '.[mysql,openai,emulator]' --group test-mysql" in makefile
    test = makefile.split("\ntest: venv ", 1)[1].split("\n\n", 1)[0]
    assert test.index("test-google") < test.index("test-mysql"), "`make test` runs the MySQL lane"


def _top_level_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


# import name -> distribution that provides it
PROVIDED_BY = {
    "airflow": "apache-airflow",
    "airflow.providers.common.compat": "apache-airflow-providers-common-compat",
    "airflow.providers.amazon": "apache-airflow-providers-amazon",
    "airflow.providers.cncf.kubernetes": "apache-airflow-providers-cncf-kubernetes",
    "airflow.providers.standard": "apache-airflow-providers-standard",
    "airflow.providers.google": "apache-airflow-providers-google",
    "airflow.providers.openlineage": "apache-airflow-providers-openlineage",
    "google.genai": "google-genai",
    "google.auth": "google-auth",
    "google": "google-genai",  # ``from google import genai``
    "psycopg2": "psycopg2-binary",
    "yaml": "pyyaml",
}


def _distribution(module: str) -> str:
    for prefix in sorted(PROVIDED_BY, key=len, reverse=True):
        if module == prefix or module.startswith(prefix + "."):
            return PROVIDED_BY[prefix]
    return _norm(module.split(".")[0])


# distribution -> the one module that imports it, behind a check that it is installed: the `vertex`
# extra works without it (the `google` extra adds it). Nothing else may import it.
GUARDED = {"apache-airflow-providers-google": "airflow_batch_provider/hooks/google.py"}


def test_every_third_party_import_of_the_package_is_declared() -> None:
    declared = {_norm(r.name) for r in runtime_requirements()}
    # what the declared requirements bring with them by contract (Airflow's own dependencies)
    implied = {"pydantic", "packaging", "fsspec", "universal-pathlib", "typing-extensions", "apache-airflow"}
    own = {"airflow_batch_provider", "batch_emulator"}
    missing = set()
    for path in [p for package in sorted(own) for p in (REPO_ROOT / package).rglob("*.py")]:
        for module in _top_level_imports(path):
            root = module.split(".")[0]
            if root in own or root in sys.stdlib_module_names or root == "__future__":
                continue
            dist = _distribution(module)
            if dist not in declared | implied:
                missing.add(f"{path.relative_to(REPO_ROOT)}: {module} ({dist})")
    assert not missing, "imported but not declared in pyproject.toml:\n" + "\n".join(sorted(missing))


def test_the_google_provider_is_imported_in_one_module_and_only_under_a_check_that_it_is_installed() -> None:
    for path in (REPO_ROOT / "airflow_batch_provider").rglob("*.py"):
        found = {_distribution(m) for m in _top_level_imports(path)} & GUARDED.keys()
        assert all(GUARDED[dist] == str(path.relative_to(REPO_ROOT)) for dist in found), path
    for dist, where in GUARDED.items():
        tree = ast.parse((REPO_ROOT / where).read_text(encoding="utf-8"))
        guarded = {
            id(node)
            for branch in ast.walk(tree)
            if isinstance(branch, ast.If) and "_provider()" in ast.unparse(branch.test)
            for stmt in branch.body
            for node in ast.walk(stmt)
        }
        imports = [
            node
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module and _distribution(node.module) == dist
        ]
        assert imports, f"{where} no longer imports {dist}: drop it from GUARDED"
        assert all(id(node) in guarded for node in imports), f"{where} imports {dist} unguarded"


def _module_level_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_the_emulator_is_built_beside_the_provider_and_its_extra_holds_its_web_framework() -> None:
    assert "batch_emulator*" in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    assert PYPROJECT["project"]["scripts"]["batch-emulator"] == "batch_emulator.__main__:main"
    extra = {_norm(Requirement(r).name) for r in PYPROJECT["project"]["optional-dependencies"]["emulator"]}
    needed = set()
    for path in (REPO_ROOT / "batch_emulator").rglob("*.py"):
        for module in _module_level_imports(path):
            root = module.split(".")[0]
            if root != "batch_emulator" and root not in sys.stdlib_module_names and root != "__future__":
                needed.add(_distribution(module))
    # uvicorn is imported where the server starts; boto3 only by the Bedrock routes (the bedrock extra)
    assert needed <= extra, f"the emulator imports {sorted(needed - extra)} outside its extra"
    assert {"fastapi", "starlette", "uvicorn"} <= extra


def test_no_runtime_dependency_is_declared_that_nothing_imports() -> None:
    imported: set[str] = set()
    for path in (REPO_ROOT / "airflow_batch_provider").rglob("*.py"):
        imported |= {_distribution(m) for m in _top_level_imports(path)}
    unused = [
        str(r)
        for r in (Requirement(x) for x in PYPROJECT["project"]["dependencies"])
        if _norm(r.name) not in imported
    ]
    assert not unused, f"declared but never imported: {unused}"


def test_the_version_is_written_in_one_place() -> None:
    assert "version" in PYPROJECT["project"]["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "airflow_batch_provider.__version__"
    }
    assert (REPO_ROOT / "LICENSE").read_text(encoding="utf-8").lstrip().startswith("Apache License")
    from airflow_batch_provider import __version__
    from airflow_batch_provider.get_provider_info import get_provider_info

    assert get_provider_info()["versions"] == [__version__]


def test_project_urls_are_absolute_https_addresses_or_absent() -> None:
    """No placeholder or repository-relative link reaches PyPI."""
    urls = PYPROJECT["project"].get("urls", {})
    bad = {k: v for k, v in urls.items() if not re.match(r"^https://[a-z0-9.-]+\.[a-z]{2,}/", v)}
    assert not bad, f"project URLs must be absolute https addresses: {bad}"


def test_development_requirements_are_dependency_groups_not_published_extras() -> None:
    extras = set(PYPROJECT["project"]["optional-dependencies"])
    assert not extras & DEV_GROUPS, f"published development extras: {sorted(extras & DEV_GROUPS)}"
    assert set(PYPROJECT["dependency-groups"]) == DEV_GROUPS
    assert extras == RUNTIME_EXTRAS | {"all"}


def test_the_openlineage_extra_brings_airflows_openlineage_provider_and_all_holds_it() -> None:
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert [Requirement(r).name for r in extras["openlineage"]] == ["apache-airflow-providers-openlineage"]
    (everything,) = (Requirement(r) for r in extras["all"])
    assert "openlineage" in everything.extras


def test_the_license_is_an_spdx_expression_and_every_tested_python_is_classified() -> None:
    project = PYPROJECT["project"]
    assert project["license"] == "Apache-2.0"
    classifiers = set(project["classifiers"])
    assert (
        f"Programming Language :: Python :: {sys.version_info.major}.{sys.version_info.minor}" in classifiers
    )
    floor = project["requires-python"].removeprefix(">=")
    assert f"Programming Language :: Python :: {floor}" in classifiers


@pytest.fixture(scope="module")
def built_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from this tree."""
    return floor_env.build_wheel(tmp_path_factory.mktemp("wheel") / "dist")


@pytest.fixture(scope="module")
def wheel_metadata(built_wheel: Path) -> Message:
    """The METADATA of the wheel built from this tree, as PyPI reads it."""
    return floor_env.wheel_metadata(built_wheel)


def test_the_floors_of_make_test_lowest_are_every_floor_of_the_wheel_and_its_all_extra(
    wheel_metadata: Message,
) -> None:
    """``tests/support/floor_env.py`` pins these (a constraints file of floors) for ``make test-lowest``."""
    project = PYPROJECT["project"]
    extras = project["optional-dependencies"]
    (everything,) = (Requirement(r) for r in extras["all"])
    declared = [Requirement(r) for r in project["dependencies"]]
    declared += [Requirement(r) for extra in sorted(everything.extras) for r in extras[extra]]
    expected = {_norm(r.name): s.version for r in declared for s in r.specifier if s.operator == ">="}
    assert floor_env.declared_floors(wheel_metadata) == expected
    assert "apache-airflow-providers-google" not in expected, "the `google` extra is not in `all`"


def test_the_wheel_carries_the_pages_templates_and_its_chart_script(built_wheel: Path) -> None:
    with zipfile.ZipFile(built_wheel) as archive:
        names = set(archive.namelist())
    plugins = REPO_ROOT / "airflow_batch_provider" / "plugins"
    shipped = [p.relative_to(REPO_ROOT).as_posix() for p in (plugins / "templates").glob("*.html")]
    assert "airflow_batch_provider/plugins/static/trend.js" in names
    assert "airflow_batch_provider/plugins/templates/trend.html" in shipped
    assert set(shipped) <= names


def test_the_wheel_names_its_documentation_source_changelog_and_issues_in_the_repository(
    wheel_metadata: Message,
) -> None:
    urls = dict(entry.split(", ", 1) for entry in wheel_metadata.get_all("Project-URL") or [])
    assert set(urls) == {"Documentation", "Source", "Changelog", "Issues"}
    source = urls["Source"]
    assert re.match(r"^https://github\.com/[\w.-]+/[\w.-]+$", source), source
    assert urls["Issues"] == f"{source}/issues"
    for label in ("Documentation", "Changelog"):
        assert urls[label].startswith(f"{source}/blob/main/"), urls[label]
        path = urls[label].removeprefix(f"{source}/blob/main/")
        assert (REPO_ROOT / path).is_file(), f"{label} names {path}, which is not in the repository"


def test_the_wheel_classifies_every_supported_python_and_states_its_license(wheel_metadata: Message) -> None:
    assert wheel_metadata["License-Expression"] == "Apache-2.0"
    assert wheel_metadata["Requires-Python"] == ">=3.10"
    classifiers = set(wheel_metadata.get_all("Classifier") or [])
    assert {f"Programming Language :: Python :: 3.{minor}" for minor in (10, 11, 12, 13)} <= classifiers
    assert {
        "Programming Language :: Python :: 3 :: Only",
        "Framework :: Apache Airflow :: Provider",
    } <= classifiers


def test_the_readme_promises_the_airflow_floor_that_the_wheel_declares(wheel_metadata: Message) -> None:
    """The floor environment (tests/docs) is built at the wheel's floor: the README names that floor."""
    floor = floor_env.declared_floors(wheel_metadata)["apache-airflow"]
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    assert f"Into any Airflow environment from {floor} on" in readme, (
        f"the README's quick start names {floor}"
    )
    assert f"as written with Airflow {floor}" in readme
