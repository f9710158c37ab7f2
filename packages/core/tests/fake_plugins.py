"""Fake installed plugins: ``*.dist-info`` directories with real entry points, on ``sys.path``."""

from __future__ import annotations

import importlib
import sys
import textwrap
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stratagem.registry import Registry


class FakeDistributions:
    """Writes ``<name>.dist-info`` directories and modules into a directory on ``sys.path``.

    Each test gets its own entry-point group, so installed plugins never take part, and
    module names unique to the test, so nothing is shared through ``sys.modules``.
    """

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.root = root
        self.tag = uuid.uuid4().hex[:8]
        self.group = f"stratagem_test_{self.tag}.strategies"
        self.added = 0
        monkeypatch.setattr(sys, "path", list(sys.path))

    def module_name(self, stem: str) -> str:
        return f"{stem}_{self.tag}"

    def add(
        self,
        distribution: str,
        modules: dict[str, str],
        entry_points: dict[str, str],
        requires: tuple[str, ...] | list[str] = (),
        version: str = "1.0",
        group: str | None = None,
    ) -> Path:
        """``modules`` maps module stems to source; ``entry_points`` maps names to ``stem:attr``.

        Each distribution gets its own ``sys.path`` entry, after those added before it, so
        entry points are discovered in the order the distributions were added. ``group``
        defaults to this test's own group. Returns the directory put on ``sys.path``.
        """
        directory = self.root / distribution
        directory.mkdir()
        sys.path.insert(self.added, str(directory))
        self.added += 1
        for stem, source in modules.items():
            (directory / f"{self.module_name(stem)}.py").write_text(textwrap.dedent(source))
        info = directory / f"{distribution.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        requirement_lines = "".join(f"Requires-Dist: {line}\n" for line in requires)
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n{requirement_lines}"
        )
        lines = [f"[{group or self.group}]"]
        for name, value in entry_points.items():
            stem, _, attribute = value.partition(":")
            lines.append(f"{name} = {self.module_name(stem)}:{attribute}")
        (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
        importlib.invalidate_caches()
        return directory

    def registry(
        self,
        builtins: Callable[[Registry], None] | None = None,
        kind: str = "strategy",
        interface: str | None = None,
    ) -> Registry:
        return Registry(kind, self.group, builtins, interface=interface)


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    distributions = FakeDistributions(tmp_path, monkeypatch)
    yield distributions
    for name in [name for name in sys.modules if name.endswith(distributions.tag)]:
        del sys.modules[name]


def register_source(*registrations: str) -> str:
    """The source of a ``register(registry)`` function making these ``registry.register(...)`` calls."""
    body = "\n".join(f"    registry.register({line})" for line in registrations) or "    pass"
    return f"def register(registry):\n{body}\n"
