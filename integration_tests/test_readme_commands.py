"""README.md's commands, pasted in order into a fresh copy of the repository, as a new user would.

The quick start creates ``.venv`` and trains; every later command runs with that environment
activated, as the README says to do. A command the test does not run must be listed in
``readme_commands.DOCUMENTATION_ONLY`` with the reason, so a new README command cannot go
untested unnoticed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest
from readme_commands import DOCUMENTATION_ONLY, README, console_samples, shell_commands

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

REPOSITORY = README.parent
QUICK_START = shell_commands()[0]


@pytest.fixture(scope="module")
def fresh_copy(tmp_path_factory):
    """The repository's tracked files, without any environment or build output."""
    files = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPOSITORY, capture_output=True, text=True, check=True
    ).stdout.split("\0")
    copy = tmp_path_factory.mktemp("fresh") / "stratagem"
    for name in filter(None, files):
        source = REPOSITORY / name
        if source.is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy / name)
    return copy


def _user_environment(copy):
    environment = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    environment.setdefault("DS_ACCELERATOR", "cpu")
    # DeepSpeed caches compiled ops per install path: this copy's would replace the shared ones.
    environment["TORCH_EXTENSIONS_DIR"] = str(copy / ".torch_extensions")
    return environment


def _paste(command, cwd, activate):
    script = f"set -e\n{'source .venv/bin/activate' if activate else ''}\n{command}\n"
    return subprocess.run(
        ["bash", "-c", script], cwd=cwd, capture_output=True, text=True, timeout=900, env=_user_environment(cwd)
    )


def test_the_readme_says_to_activate_the_environment_the_quick_start_creates():
    text = README.read_text()
    assert "source .venv/bin/activate" in text


def test_every_readme_command_works_pasted_in_order_into_a_fresh_copy(fresh_copy):
    outputs = {}
    for command in shell_commands():
        # A command shown again (a package's section repeats the tour's demo line) ran already in this environment,
        # which the installs between only add packages to: it would run the same code on the same packages.
        if command in DOCUMENTATION_ONLY or _without_comment(command) in outputs:
            continue
        finished = _paste(command, fresh_copy, activate=command != QUICK_START)
        assert finished.returncode == 0, (
            f"{command}\n--- stdout\n{finished.stdout[-3000:]}\n--- stderr\n{finished.stderr[-5000:]}"
        )
        outputs[_without_comment(command)] = finished.stdout
    assert outputs, "the README has no commands"
    for command, shown in console_samples():
        finished = _paste(command, fresh_copy, activate=True)
        assert finished.returncode == 0, finished.stderr
        printed = [line.split() for line in finished.stdout.splitlines()]
        for line in shown:
            assert line.split() in printed, f"README shows {line!r} under `{command}`; it printed:\n{finished.stdout}"


def _without_comment(command):
    """``command`` without a trailing ``# ...`` comment (the README explains some commands on their line)."""
    return re.sub(r"\s+#[^'\"]*$", "", command)


def test_a_trailing_comment_does_not_make_a_command_another():
    assert _without_comment("stratagem demo --devices 2    # two CPU processes (stratagem-ddp)") == (
        "stratagem demo --devices 2"
    )
    assert _without_comment("stratagem demo --logger '#tag'") == "stratagem demo --logger '#tag'"


def test_no_documentation_only_entry_is_stale():
    assert set(DOCUMENTATION_ONLY) <= set(shell_commands())
