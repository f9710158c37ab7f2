"""Making a plugin visible to stratagem without installing it, for tests.

stratagem discovers plugins through installed distributions' entry points. A test can make a
directory look like an installed distribution (a ``*.dist-info`` folder with ``METADATA`` and
``entry_points.txt``); a process with that directory, and the plugin's code, on ``sys.path`` or
``PYTHONPATH`` then discovers the plugin as if pip had installed it. Nothing is written to the
environment, so no other test or process sees it.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, before it joined the standard library
    import tomli as tomllib


def write_distribution(
    directory: Path,
    name: str,
    entry_points: Mapping[str, Mapping[str, str]],
    requires: Sequence[str] = (),
    version: str = "0.0.0",
) -> Path:
    """Write the metadata of distribution ``name`` into ``directory``; return its ``.dist-info`` folder.

    ``entry_points`` maps a group (``"stratagem.strategies"``) to ``{entry point name: "module:function"}``;
    ``requires`` are its requirements (``"stratagem>=0.1,<0.2"``), which stratagem checks on discovery.
    """
    info = Path(directory) / f"{re.sub(r'[-_.]+', '_', name)}-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    metadata = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    metadata += [f"Requires-Dist: {requirement}" for requirement in requires]
    (info / "METADATA").write_text("\n".join(metadata) + "\n")
    sections = []
    for group, points in entry_points.items():
        sections.append(f"[{group}]\n" + "".join(f"{point} = {target}\n" for point, target in points.items()))
    (info / "entry_points.txt").write_text("\n".join(sections))
    return info


def write_distribution_of_project(directory: Path, project: Path) -> Path:
    """Write the metadata that ``project``'s ``pyproject.toml`` declares (name, version, dependencies,
    entry points) into ``directory``; return the folder holding the project's code (``src/``) to put
    on the path beside ``directory``."""
    declared = tomllib.loads((Path(project) / "pyproject.toml").read_text())["project"]
    write_distribution(
        directory,
        declared["name"],
        declared.get("entry-points", {}),
        requires=declared.get("dependencies", ()),
        version=declared["version"],
    )
    return Path(project) / "src"
