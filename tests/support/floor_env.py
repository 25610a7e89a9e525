"""The floor environment: the built wheel, installed as a user installs it, into Airflow at its floor.

One virtualenv serves the checks of issue 21's "done when" and ``make test-lowest``, in steps:

1. :func:`create`: an Airflow deployment at the floor, then the wheel. The wheel is built from this
   tree (``uv build``); the deployment is ``apache-airflow`` at the floor the wheel's metadata
   declares and every ``apache-airflow-providers-*`` distribution the wheel requires, each at the
   floor the wheel declares (Airflow's own constraints file for that release is not reachable
   offline). Into it the venv's own ``pip`` installs the wheel with the extras the README's quick
   start names, without constraints, as a user types the README's line. What is installed before
   and after is recorded in :data:`RECORD` (the tests of ``tests/docs`` read it).
2. :func:`lower_to_floors` (``make venv-lowest``): every direct requirement of the project (all
   extras) at its declared floor, from a constraints file generated from the wheel's metadata, the
   test tools at constraints.txt's pins, the project editable: the representative tests of
   ``make test-lowest`` run there.

``python -m tests.support.floor_env DEST [--lowest]`` builds it from the command line (the Makefile).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from email import message_from_bytes
from email.message import Message
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]
UV = Path(sys.executable).parent / "uv"
RECORD = "floor-env.json"
# the test tools of `make test-lowest`, at constraints.txt's pins (they are not the project's floors)
TOOLS = (
    "pytest",
    "pytest-asyncio",
    "pytest-timeout",
    "pytest-xdist",
    "hypothesis",
    "moto[server]",
    "statsd",
    "openapi-schema-validator",
    'pgserver; python_version < "3.13" and ((sys_platform == "linux" and platform_machine == "x86_64")'
    ' or sys_platform == "darwin")',
)


@dataclass(frozen=True)
class FloorEnv:
    """A built floor environment.

    :param root: the virtualenv's folder
    :param wheel: the wheel installed into it
    :param airflow_floor: the ``apache-airflow`` floor the wheel declares
    :param before: distribution name -> version of the Airflow deployment, before the wheel
    :param after: distribution name -> version after the README's ``pip install`` line
    :param run: the id of the test run (or command) that built it
    :param inputs: :func:`inputs_digest` when it was built
    """

    root: Path
    wheel: Path
    airflow_floor: str
    before: dict[str, str]
    after: dict[str, str]
    run: str
    inputs: str

    @property
    def bin(self) -> Path:
        """The virtualenv's ``bin`` folder, to put first on ``PATH``."""
        return self.root / "bin"

    def environ(self) -> dict[str, str]:
        """A user's shell in this virtualenv: its ``bin`` first on ``PATH``, no Airflow setting, nothing
        of the test run's own environment (``VIRTUAL_ENV``, ``PYTHONPATH``) that would reach the source tree."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
        env.pop("VIRTUAL_ENV", None)
        env.pop("PYTHONPATH", None)
        env["PATH"] = f"{self.bin}{os.pathsep}{env['PATH']}"
        return env


def inputs_digest() -> str:
    """A digest of the files that decide what the floor environment holds: metadata, README, pins."""
    digest = hashlib.sha256()
    for name in ("pyproject.toml", "README.md", "constraints.txt"):
        digest.update((REPO / name).read_bytes())
    return digest.hexdigest()


def readme_extras() -> str:
    """The extras the README's quick start installs (``openai,emulator``)."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    found = re.search(r"pip install 'airflow-batch-provider\[([a-z,]+)\]'", text)
    assert found, (
        "the README's quick start names the extras to install: pip install 'airflow-batch-provider[...]'"
    )
    return found[1]


def build_wheel(out: Path) -> Path:
    """Build the wheel of this tree into ``out`` and return its path.

    :param out: an empty or missing folder
    """
    subprocess.run(
        [str(UV), "build", "--quiet", "--wheel", "--out-dir", str(out), str(REPO)], check=True, cwd=out.parent
    )
    (wheel,) = out.glob("*.whl")
    return wheel


def wheel_metadata(wheel: Path) -> Message:
    """The wheel's METADATA, as PyPI and pip read it.

    :param wheel: the built wheel
    """
    with zipfile.ZipFile(wheel) as archive:
        (name,) = (n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return message_from_bytes(archive.read(name))


def declared_floors(metadata: Message) -> dict[str, str]:
    """Each requirement of the wheel and of its ``all`` extra with a ``>=`` floor: name -> floor.

    :param metadata: the wheel's METADATA (:func:`wheel_metadata`)
    """
    message = metadata
    requirements = [Requirement(line) for line in message.get_all("Requires-Dist") or []]
    (everything,) = (r for r in requirements if r.marker is not None and r.marker.evaluate({"extra": "all"}))
    floors: dict[str, str] = {}
    for requirement in requirements:
        marker = requirement.marker
        if marker is not None and not any(marker.evaluate({"extra": e}) for e in everything.extras):
            continue  # an extra outside `all` (`google`: its provider cannot sit beside the `openai` extra)
        for spec in requirement.specifier:
            if spec.operator == ">=":
                floors[_norm(requirement.name)] = spec.version
    return floors


def create(root: Path, run: str) -> FloorEnv:
    """Build the floor environment afresh in ``root`` (an existing virtualenv there is removed first).

    :param root: the virtualenv's folder
    :param run: an id of the run that builds it, recorded so that one run builds it once
    """
    inputs = inputs_digest()
    if root.exists():
        if not (root / "pyvenv.cfg").is_file():
            raise RuntimeError(
                f"{root} exists and is not a virtualenv: refusing to replace it; name an empty folder"
            )
        shutil.rmtree(root)
    root.mkdir(parents=True)
    wheel = build_wheel(root / "dist")
    floors = declared_floors(wheel_metadata(wheel))
    (root / "floors.txt").write_text(
        "".join(f"{n}=={v}\n" for n, v in sorted(floors.items())), encoding="utf-8"
    )
    python = root / "bin" / "python"
    subprocess.run(
        [str(UV), "venv", "--quiet", "--allow-existing", "--seed", "--python", sys.executable, str(root)],
        check=True,
    )
    deployment = [f"{name}=={floors[name]}" for name in sorted(floors) if name.startswith("apache-airflow")]
    _uv_install(python, "-c", str(root / "floors.txt"), *deployment)
    before = installed(python)
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--quiet", "--disable-pip-version-check", "--progress-bar", "off",
         f"airflow-batch-provider[{readme_extras()}] @ {wheel.as_uri()}"],
        check=True,
    )  # fmt: skip
    env = FloorEnv(root, wheel, floors["apache-airflow"], before, installed(python), run, inputs)
    (root / RECORD).write_text(json.dumps({**vars(env), "root": str(root), "wheel": str(wheel)}), "utf-8")
    return env


def load(root: Path) -> FloorEnv | None:
    """The floor environment recorded in ``root``, or None where none was built there.

    :param root: the virtualenv's folder
    """
    try:
        record = json.loads((root / RECORD).read_text(encoding="utf-8"))
        record.update(root=root, wheel=Path(record["wheel"]))
        return FloorEnv(**record)
    except (
        OSError,
        ValueError,
        KeyError,
        TypeError,
    ):  # none, or one recorded by an older version of this module
        return None


def lower_to_floors(root: Path) -> None:
    """Every direct requirement at its declared floor, the test tools, the project editable (``make test-lowest``).

    :param root: a floor environment built by :func:`create`
    """
    env = load(root)
    if env is None:
        raise RuntimeError(
            f"{root} holds no floor environment ({RECORD} is missing): build it with create() first"
        )
    tools = root / "tool-pins.txt"
    names = {_norm(re.split(r"[\[;<>=!~ ]", tool, maxsplit=1)[0]) for tool in TOOLS}
    pinned = [
        line
        for line in (REPO / "constraints.txt").read_text("utf-8").splitlines()
        if _pin_name(line) in names
    ]
    tools.write_text("\n".join(pinned) + "\n", encoding="utf-8")
    _uv_install(
        root / "bin" / "python",
        "-c",
        str(root / "floors.txt"),
        "-c",
        str(tools),
        "-e",
        f"{REPO}[all]",
        *TOOLS,
    )


def installed(python: Path) -> dict[str, str]:
    """Distribution name (normalized) -> version of everything installed in a virtualenv.

    :param python: the virtualenv's interpreter
    """
    listing = subprocess.run(
        [str(python), "-I", "-c",
         "import importlib.metadata as m, json; print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return {_norm(name): version for name, version in json.loads(listing.stdout).items()}


def _uv_install(python: Path, *args: str) -> None:
    # compiled once here: else the first `airflow` commands of the tests compile Airflow, side by side
    subprocess.run(
        [str(UV), "pip", "install", "--quiet", "--compile-bytecode", "--python", str(python), *args],
        check=True,
    )


def _pin_name(line: str) -> str:
    return _norm(line.split("==", 1)[0]) if "==" in line and not line.startswith("#") else ""


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def main(argv: list[str] | None = None) -> None:
    """``python -m tests.support.floor_env DEST [--lowest]``.

    :param argv: the arguments (``sys.argv[1:]`` by default)
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("root", type=Path, help="the virtualenv's folder")
    parser.add_argument(
        "--lowest", action="store_true", help="then lower every direct requirement to its floor"
    )
    args = parser.parse_args(argv)
    root = args.root.resolve()
    built = load(root)
    if built is None or built.inputs != inputs_digest():
        create(root, run="command line")
    if args.lowest:
        lower_to_floors(root)


if __name__ == "__main__":
    main()
