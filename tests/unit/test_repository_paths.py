"""Nothing in the repository reads or names a path above its own root.

A user's clone has nothing beside it: a build step, test, demo or benchmark that reaches for
``../something`` passes in the maintainers' checkout and fails everywhere else. Two checks:
every ``Path(__file__)`` walk upwards in Python (and every ``.parent`` taken of a name bound to
one) must stay inside the repository, and no file may spell a relative path that climbs out of it.
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
TEXT_SUFFIXES = {".py", ".sh", ".toml", ".yaml", ".yml", ".cfg", ".ini", ".json", ".md", ".html", ".txt", ""}
# ``../x`` as a path segment (not ``.../`` prose, not ``a../``)
CLIMB = re.compile(r"(?<![.\w])\.\.[/\\]")
# a test's deliberately hostile input (a workload named "../..") carries this comment on its line
HOSTILE_MARK = "# hostile input"
# a path-like token: what stands between spaces, quotes, backticks, brackets and parentheses
TOKEN = re.compile(r"[^\s`'\"()\[\]<>,;=]+")


def tracked_files() -> list[Path]:
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=REPO_ROOT,
            capture_output=True,
            check=True,
        ).stdout
        names = [n for n in out.decode().split("\0") if n]
    except (OSError, subprocess.CalledProcessError):  # an export without .git
        names = [
            str(p.relative_to(REPO_ROOT))
            for p in REPO_ROOT.rglob("*")
            if p.is_file() and not {".git", ".venv", "node_modules"} & set(p.parts)
        ]
    return [REPO_ROOT / n for n in names if (REPO_ROOT / n).is_file()]


def text_files() -> list[Path]:
    return [p for p in tracked_files() if p.suffix in TEXT_SUFFIXES or p.name in {"Makefile", "Dockerfile"}]


def _levels_up(node: ast.expr, bound: dict[str, int]) -> int | None:
    """How many directories above the file's own folder ``node`` points, or None if not a walk."""
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Name) and func.id == "Path" and node.args:
            arg = node.args[0]
            if isinstance(arg, ast.Name) and arg.id == "__file__":
                return -1  # the file itself: its folder is one ``.parent`` away
        if isinstance(func, ast.Attribute) and func.attr in {"resolve", "absolute"}:
            return _levels_up(func.value, bound)
        return None
    if isinstance(node, ast.Name):
        return bound.get(node.id)
    if isinstance(node, ast.Attribute) and node.attr == "parent":
        inner = _levels_up(node.value, bound)
        return None if inner is None else inner + 1
    if (
        isinstance(node, ast.Subscript)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "parents"
        and isinstance(node.slice, ast.Constant)
        and isinstance(node.slice.value, int)
    ):
        inner = _levels_up(node.value.value, bound)
        return None if inner is None else inner + node.slice.value + 1
    return None


def upward_walks(path: Path) -> list[tuple[int, Path]]:
    """Every ``Path(__file__)``-based folder in ``path``: (line, the folder it resolves to)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    bound: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            levels = _levels_up(node.value, bound)
            if levels is not None:
                bound[node.targets[0].id] = levels
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            levels = _levels_up(node.value, bound)
            if levels is not None:
                bound[node.target.id] = levels
    walks = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Attribute, ast.Subscript)):
            levels = _levels_up(node, bound)
            if levels is not None and levels >= 0:
                folder = path.parent
                for _ in range(levels):
                    folder = folder.parent
                walks.append((node.lineno, folder))
    return walks


def test_the_scan_sees_the_files_it_must_check() -> None:
    names = {p.relative_to(REPO_ROOT).as_posix() for p in text_files()}
    assert {
        "Makefile",
        "pyproject.toml",
        "tests/conftest.py",
        "tests/unit/batch_emulator/conftest.py",
    } <= names


def walks_outside(path: Path, root: Path) -> list[str]:
    """The upward walks of ``path`` that leave ``root``, as ``file:line -> folder``."""
    return [
        f"{path.relative_to(root)}:{line} -> {folder}"
        for line, folder in upward_walks(path)
        if folder != root and root not in folder.parents
    ]


def test_no_python_file_walks_above_the_repository_root() -> None:
    outside = [w for p in tracked_files() if p.suffix == ".py" for w in walks_outside(p, REPO_ROOT)]
    assert not outside, "paths above the repository root (a user's clone has nothing there):\n" + "\n".join(
        outside
    )


def climbs_out(file: Path, line: str, root: Path) -> bool:
    """Tell whether ``line`` of ``file`` spells a relative path that leaves ``root``.

    A Markdown link target is relative to its page; any other path (commands in scripts and the
    Makefile, strings in code, names in prose) may be read from the repository root or from the
    file's folder, and must stay inside the repository from both.
    """
    for token in TOKEN.findall(line):
        if not CLIMB.search(token):
            continue
        is_link = file.suffix == ".md" and f"]({token}" in line
        bases = [file.parent] if is_link else [file.parent, root]
        for base in bases:
            target = (base / token).resolve()
            if target != root and root not in target.parents:
                return True
    return "shared/specs" in line or "shared/notes" in line


def test_no_file_names_a_relative_path_that_climbs_out_of_the_repository() -> None:
    offenders = []
    for path in text_files():
        if path == Path(__file__).resolve():
            continue  # its own examples of what it refuses
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        offenders.extend(
            f"{path.relative_to(REPO_ROOT)}:{number}: {line.strip()}"
            for number, line in enumerate(text.splitlines(), start=1)
            if climbs_out(path, line, REPO_ROOT) and HOSTILE_MARK not in line
        )
    assert not offenders, "names of paths outside the repository:\n" + "\n".join(offenders)


@pytest.mark.parametrize(
    ("source", "escapes"),
    [
        ("ROOT = Path(__file__).resolve().parents[2]\n", False),
        ("ROOT: Path = Path(__file__).resolve().parents[2]\nX = ROOT.parent / 'shared'\n", True),
        ("X = Path(__file__).parent.parent.parent.parent / 'specs'\n", True),
        ("X = Path(__file__).resolve().parents[3] / 'specs'\n", True),
        ("X = Path(__file__).parent / 'schemas'\n", False),
    ],
)
def test_the_python_check_catches_a_walk_above_the_root(tmp_path: Path, source: str, escapes: bool) -> None:
    root = tmp_path / "repo"
    probe = root / "tests" / "unit" / "test_probe.py"
    probe.parent.mkdir(parents=True)
    probe.write_text("from pathlib import Path\n" + source)
    assert bool(walks_outside(probe, root)) == escapes


@pytest.mark.parametrize(
    ("name", "line", "escapes"),
    [
        ("tests/unit/conftest.py", "spec = '../shared/specs/openai-openapi.yaml'", True),
        ("Makefile", "\tcp ../../etc/x .", True),
        ("scripts/demo.sh", "cat ../README.md", True),
        ("scripts/demo.sh", "cat ../../README.md", True),
        ("docs/a.md", "[the README](../README.md)", False),
        ("docs/a.md", "`../shared/DESIGN.md` is the spine", True),
        ("dags/x.py", "see include/../dags/x.py", False),
        ("tests/unit/x.py", "# POST to .../batchPredictionJobs", False),
        ("README.md", "[docs](docs/../README.md)", False),
    ],
)
def test_the_text_check_catches_a_relative_climb(tmp_path: Path, name: str, line: str, escapes: bool) -> None:
    root = tmp_path / "repo"
    assert climbs_out(root / name, line, root) == escapes
