"""Build each package's wheel and sdist as a release would, and say what a built wheel lacks."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from configparser import ConfigParser
from pathlib import Path

import tomllib

REPOSITORY = Path(__file__).resolve().parents[1]
PACKAGE_DIRECTORIES = sorted(path.parent for path in (REPOSITORY / "packages").glob("*/pyproject.toml"))
PLUGIN_EXAMPLES = sorted(path.parent for path in (REPOSITORY / "examples").glob("*/pyproject.toml"))


def build(project: Path, output: Path) -> tuple[Path, Path]:
    """The wheel and the sdist of ``project``, built by its build backend (poetry-core) into ``output``."""
    code = (
        "import sys\n"
        "from poetry.core.masonry import api\n"
        "print(api.build_wheel(sys.argv[1]))\n"
        "print(api.build_sdist(sys.argv[1]))\n"
    )
    built = subprocess.run(
        [sys.executable, "-c", code, str(output)], cwd=project, capture_output=True, text=True, timeout=300
    )
    if built.returncode != 0:
        raise RuntimeError(f"building {project.name} failed:\n{built.stderr[-4000:]}")
    wheel, sdist = built.stdout.split()[-2:]
    return output / wheel, output / sdist


def project_metadata(project: Path) -> dict:
    return tomllib.loads((project / "pyproject.toml").read_text())["project"]


def import_names(project: Path) -> list[str]:
    return [path.name for path in (project / "src").iterdir() if (path / "__init__.py").exists()]


def wheel_problems(wheel: Path, project: Path) -> list[str]:
    """What the wheel of ``project`` should carry and does not: typing marker, README, entry points."""
    declared = project_metadata(project)
    problems = []
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        dist_info = next((name.split("/")[0] for name in names if name.split("/")[0].endswith(".dist-info")), None)
        if dist_info is None:
            return [f"{wheel.name}: no .dist-info directory"]
        for package in import_names(project):
            if f"{package}/py.typed" not in names:
                problems.append(f"{wheel.name}: {package}/py.typed is missing")
            sources = {str(path.relative_to(project / "src")) for path in (project / "src" / package).rglob("*.py")}
            missing = sorted(sources - names)
            if missing:
                problems.append(f"{wheel.name}: modules missing: {missing}")
        metadata = archive.read(f"{dist_info}/METADATA").decode()
        readme_first_line = (project / declared["readme"]).read_text().splitlines()[0]
        if readme_first_line not in metadata:
            problems.append(f"{wheel.name}: METADATA does not carry {declared['readme']} as its description")
        problems += _entry_point_problems(archive, names, dist_info, declared, wheel.name)
    return problems


def _entry_point_problems(
    archive: zipfile.ZipFile, names: set[str], dist_info: str, declared: dict, wheel_name: str
) -> list[str]:
    expected = {group: dict(points) for group, points in declared.get("entry-points", {}).items()}
    if "scripts" in declared:
        expected["console_scripts"] = dict(declared["scripts"])
    if not expected:
        return []
    if f"{dist_info}/entry_points.txt" not in names:
        return [f"{wheel_name}: entry_points.txt is missing (declared: {sorted(expected)})"]
    parser = ConfigParser(delimiters=("=",))
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(archive.read(f"{dist_info}/entry_points.txt").decode())
    found = {group: {key: value.strip() for key, value in parser[group].items()} for group in parser.sections()}
    return [
        f"{wheel_name}: entry points of {group!r} are {found.get(group, {})}, declared {points}"
        for group, points in expected.items()
        if found.get(group) != points
    ]
