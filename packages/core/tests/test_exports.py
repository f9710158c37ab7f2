"""lazy_exports: a package's public names are imported on first use, not with the package."""

from __future__ import annotations

import sys
import textwrap

import pytest


@pytest.fixture
def package(tmp_path, monkeypatch):
    root = tmp_path / "lazy_pkg"
    root.mkdir()
    (root / "__init__.py").write_text(
        textwrap.dedent(
            """
            from stratagem.exports import lazy_exports

            __all__ = ["Thing", "__version__"]
            __getattr__, __dir__ = lazy_exports(__name__, {"Thing": "lazy_pkg.heavy"}, "stratagem")
            """
        )
    )
    (root / "heavy.py").write_text("IMPORTS = []\nIMPORTS.append(1)\n\nclass Thing:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "lazy_pkg"
    for name in [name for name in sys.modules if name.split(".")[0] == "lazy_pkg"]:
        del sys.modules[name]


def test_a_name_is_imported_on_first_use_and_then_kept(package):
    import lazy_pkg

    assert "lazy_pkg.heavy" not in sys.modules
    thing = lazy_pkg.Thing
    assert thing is sys.modules["lazy_pkg.heavy"].Thing
    assert vars(lazy_pkg)["Thing"] is thing
    assert lazy_pkg.Thing is thing
    assert sys.modules["lazy_pkg.heavy"].IMPORTS == [1]


def test_version_dir_and_unknown_names(package):
    from importlib.metadata import version

    import lazy_pkg

    assert lazy_pkg.__version__ == version("stratagem")
    assert {"Thing", "__version__"} <= set(dir(lazy_pkg))
    assert "lazy_pkg.heavy" not in sys.modules
    with pytest.raises(AttributeError, match="module 'lazy_pkg' has no attribute 'Other'"):
        lazy_pkg.Other  # noqa: B018
