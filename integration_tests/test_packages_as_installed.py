"""The packages as a user gets them: built wheels and sdists, installed by extra into a fresh environment.

Every other env installs the packages editable from the source tree, where a file left out of
a wheel, an extra naming the wrong version or an entry point that exists only in the tree cannot
show. Here each package is built by its own build backend and installed from the built files
only (``--no-index``); torch and DeepSpeed come first from the index, pinned by the constraints.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile

import pytest
from distributions import (
    PACKAGE_DIRECTORIES,
    PLUGIN_EXAMPLES,
    REPOSITORY,
    build,
    import_names,
    project_metadata,
    wheel_problems,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

CONSTRAINTS = REPOSITORY / "tools" / "constraints.txt"
PROJECTS = PACKAGE_DIRECTORIES + PLUGIN_EXAMPLES


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    output = tmp_path_factory.mktemp("dist")
    return {project: build(project, output) for project in PROJECTS}


@pytest.mark.parametrize("project", PROJECTS, ids=lambda path: path.name)
def test_each_wheel_carries_every_module_its_typing_marker_readme_and_entry_points(built, project):
    wheel, _ = built[project]
    assert wheel_problems(wheel, project) == []


def test_a_wheel_that_lost_its_entry_points_or_a_module_is_caught(built, tmp_path):
    project = next(path for path in PACKAGE_DIRECTORIES if project_metadata(path).get("entry-points"))
    wheel, _ = built[project]
    broken = tmp_path / wheel.name
    package = import_names(project)[0]
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(broken, "w") as target:
        for item in source.infolist():
            if item.filename.endswith("entry_points.txt") or item.filename == f"{package}/py.typed":
                continue
            target.writestr(item, source.read(item.filename))
    problems = wheel_problems(broken, project)
    assert any("entry_points.txt is missing" in problem for problem in problems), problems
    assert any("py.typed is missing" in problem for problem in problems), problems


@pytest.mark.parametrize("project", PROJECTS, ids=lambda path: path.name)
def test_each_sdist_carries_its_build_file_readme_and_sources(built, project):
    _, sdist = built[project]
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    assert "pyproject.toml" in names
    assert project_metadata(project)["readme"] in names
    for package in import_names(project):
        sources = {str(path.relative_to(project)) for path in (project / "src" / package).rglob("*") if path.is_file()}
        assert sources - {name for name in sources if "__pycache__" in name} <= names


def test_every_extra_installs_sibling_packages_of_the_same_version():
    core = next(path for path in PACKAGE_DIRECTORIES if project_metadata(path)["name"] == "stratagem")
    extras = project_metadata(core)["optional-dependencies"]
    backends = {project_metadata(path)["name"]: project_metadata(path)["version"] for path in PACKAGE_DIRECTORIES}
    backends.pop("stratagem")
    for name, version in backends.items():
        extra = name.removeprefix("stratagem-")
        assert extras[extra] == [f"{name}=={version}"], f"stratagem[{extra}]"
    assert sorted(extras["all"]) == sorted(f"{name}=={version}" for name, version in backends.items())
    for name in backends:
        dependencies = project_metadata(REPOSITORY / "packages" / name.removeprefix("stratagem-"))["dependencies"]
        assert any(dependency.startswith("stratagem>=") for dependency in dependencies), name


@pytest.fixture(scope="module")
def user_environment(tmp_path_factory, built):
    """A fresh virtual environment holding only torch, DeepSpeed and hivemind, and a folder of the built files."""
    root = tmp_path_factory.mktemp("user")
    wheels = root / "wheels"
    wheels.mkdir()
    for wheel, _ in built.values():
        shutil.copy(wheel, wheels)
    subprocess.run([sys.executable, "-m", "venv", str(root / "venv")], check=True, timeout=120)
    python = root / "venv" / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "--quiet", "-c", str(CONSTRAINTS)]
    # DeepSpeed caches compiled ops per install path: this environment's would replace the shared ones.
    environment = {
        **os.environ,
        "DS_BUILD_OPS": "0",
        "PIP_CONSTRAINT": str(CONSTRAINTS),
        "TORCH_EXTENSIONS_DIR": str(root / "torch_extensions"),
    }
    environment.pop("PYTHONPATH", None)
    subprocess.run([*pip, "torch==2.13.0", "poetry-core>=2.0"], check=True, timeout=600, env=environment)
    subprocess.run([*pip, "--no-build-isolation", "deepspeed==0.19.8"], check=True, timeout=600, env=environment)
    # stratagem[all] includes stratagem-hivemind, whose hivemind comes from the index like DeepSpeed.
    subprocess.run([*pip, "hivemind==1.1.12"], check=True, timeout=600, env=environment)
    return {"python": python, "wheels": wheels, "env": environment, "root": root}


def _install_from_built_files(user_environment, requirement):
    python, wheels = user_environment["python"], user_environment["wheels"]
    command = [str(python), "-m", "pip", "install", "--quiet", "--no-index", "--find-links", str(wheels), requirement]
    subprocess.run(command, check=True, timeout=300, env=user_environment["env"])


def _stratagem(user_environment, *arguments, timeout=300):
    script = user_environment["python"].parent / "stratagem"
    finished = subprocess.run(
        [str(script), *arguments],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**user_environment["env"], "DS_ACCELERATOR": "cpu"},
        cwd=user_environment["root"],
    )
    assert finished.returncode == 0, f"stratagem {' '.join(arguments)}:\n{finished.stdout}\n{finished.stderr}"
    return finished.stdout


def _installed(user_environment):
    listed = subprocess.run(
        [str(user_environment["python"]), "-m", "pip", "list", "--format=freeze"],
        capture_output=True,
        text=True,
        check=True,
        env=user_environment["env"],
    ).stdout
    return {line.split("==")[0].lower() for line in listed.splitlines()}


def test_the_fsdp_extra_installs_core_and_fsdp_whose_names_then_train(user_environment):
    _install_from_built_files(user_environment, "stratagem[fsdp]")
    installed = _installed(user_environment)
    assert {"stratagem", "stratagem-fsdp"} <= installed
    assert not {"stratagem-ddp", "stratagem-deepspeed"} & installed
    assert "fsdp_cpu_offload" in _stratagem(user_environment, "strategies")
    _stratagem(user_environment, "demo", "--strategy", "fsdp", "--devices", "2", "--max-steps", "10")


def test_the_all_extra_and_the_plugin_examples_install_and_each_backend_trains(user_environment, built):
    _install_from_built_files(user_environment, "stratagem[all]")
    for project in PLUGIN_EXAMPLES:
        _install_from_built_files(user_environment, project_metadata(project)["name"])
    assert {"stratagem-ddp", "stratagem-fsdp", "stratagem-deepspeed"} <= _installed(user_environment)
    listing = _stratagem(user_environment, "strategies")
    for name in ("single_device", "ddp_spawn", "fsdp", "deepspeed_stage_3"):
        assert name in listing
    doctor = _stratagem(user_environment, "doctor")
    for project in PLUGIN_EXAMPLES:
        assert project_metadata(project)["name"] in doctor
    _stratagem(user_environment, "demo", "--max-steps", "10")
    for strategy in ("ddp", "deepspeed_stage_2"):
        _stratagem(user_environment, "demo", "--strategy", strategy, "--devices", "2", "--max-steps", "10")
