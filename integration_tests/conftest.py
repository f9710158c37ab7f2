import subprocess
import sys
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[1]
PLUGIN_SOURCES = (
    REPOSITORY / "examples" / "plugin",
    Path(__file__).resolve().parent / "plugin_fixtures" / "broken_plugin",
)


@pytest.fixture(scope="session")
def installed_plugins(tmp_path_factory):
    """The example plugin and the broken fixture plugin, built from source and installed by pip.

    They go into a directory of their own (``pip install --target``) rather than into the
    environment, so that no other test, and no other session sharing the environment, ever
    sees them: this process sees them once the directory is on ``sys.path``, and child
    processes through ``PYTHONPATH``. Removed with the session's temporary directory.
    """
    target = tmp_path_factory.mktemp("installed_plugins")
    # The integration env installs the build backend (poetry-core): building without isolation
    # then needs nothing from the package index.
    command = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--no-deps",
        "--no-build-isolation",
        "--quiet",
        "--target",
        str(target),
    ]
    subprocess.run([*command, *map(str, PLUGIN_SOURCES)], check=True, timeout=300)
    return target
