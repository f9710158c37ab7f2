"""The commands README.md tells a user to paste, in the order it gives them."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"

# Commands a user would paste that this test does not run, each with the reason.
DOCUMENTATION_ONLY = {
    'python3 -m pip install --quiet "tox>=4.11" && python3 -m tox': (
        "the test command itself: .ci/run runs it, and this test runs inside it"
    ),
}


def shell_commands(text: str | None = None) -> list[str]:
    """Every line of the README's ``bash`` blocks, in order (continuation lines joined)."""
    text = README.read_text() if text is None else text
    commands = []
    for block in re.findall(r"^```bash\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                commands.append(line.strip())
    return commands


def console_samples(text: str | None = None) -> list[tuple[str, list[str]]]:
    """Each ``console`` block as (the command after ``$ ``, the output lines shown under it)."""
    text = README.read_text() if text is None else text
    samples = []
    for block in re.findall(r"^```console\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL):
        lines = block.rstrip("\n").splitlines()
        samples.append((lines[0].removeprefix("$ ").strip(), lines[1:]))
    return samples
