"""Backends and plugin examples use core only through its public names, as a third party must."""

import ast
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
OUTSIDE_CORE = [
    path
    for root in (*sorted((REPOSITORY / "packages").glob("*/src")), *sorted((REPOSITORY / "examples").glob("*/src")))
    if root.parent.name != "core"
    for path in root.rglob("*.py")
]


def _private_core_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "stratagem":
            modules = [node.module]
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names if alias.name.split(".")[0] == "stratagem"]
            names = []
        else:
            continue
        private = [m for m in modules if any(part.startswith("_") for part in m.split("."))]
        private += [f"{node.module}.{name}" for name in names if name.startswith("_")]
        found += [f"{path.relative_to(REPOSITORY)}:{node.lineno}: {name}" for name in private]
    return found


def test_no_backend_or_example_imports_a_private_name_of_core():
    assert len(OUTSIDE_CORE) > 10
    assert [problem for path in OUTSIDE_CORE for problem in _private_core_imports(path)] == []
