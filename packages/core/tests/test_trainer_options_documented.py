"""The Trainer's options are declared once, on ``Trainer.__init__``: the loop options it checks are exactly
TrainerSettings' fields, and the README's option table documents each one with the signature's default."""

import inspect
import re
from pathlib import Path

from stratagem.connector import ResolveOptions
from stratagem.trainer import Trainer
from stratagem.trainer.settings import SETTING_NAMES

README = Path(__file__).parents[3] / "README.md"

RESOLVED_BY_THE_CONNECTOR = set(ResolveOptions.__annotations__)
"""Described in the README's prose above the table (they go to stratagem.resolve)."""

NOT_A_PYTHON_DEFAULT = {"default_root_dir": "working directory"}
"""Rows whose default column says what the default means rather than spelling it."""


def _options_table() -> dict[str, str]:
    """Each option the README's Trainer table names -> the default it gives for it."""
    text = README.read_text()
    table = text[text.index("| option | default | meaning |") :].split("\n\n", 1)[0]
    documented = {}
    for row in table.splitlines()[2:]:
        names_cell, default_cell = (cell.strip() for cell in row.strip("|").split("|")[:2])
        names = re.findall(r"`([^`]+)`", names_cell)
        defaults = re.findall(r"`([^`]+)`", default_cell) or [default_cell]
        for name, default in zip(names, defaults * len(names) if len(defaults) == 1 else defaults, strict=True):
            if "{" in name:
                prefix, choices, suffix = re.match(r"(.*)\{(.*)\}(.*)", name).groups()
                documented.update({f"{prefix}{choice}{suffix}": default for choice in choices.split(",")})
            else:
                documented[name] = default
    return documented


def test_the_loop_options_parse_settings_checks_are_parameters_of_the_trainer():
    assert set(inspect.signature(Trainer).parameters) >= SETTING_NAMES


def test_the_readme_documents_every_trainer_option_with_its_default():
    parameters = inspect.signature(Trainer).parameters
    documented = _options_table()
    assert set(documented) == set(parameters) - RESOLVED_BY_THE_CONNECTOR
    for name, default in documented.items():
        expected = NOT_A_PYTHON_DEFAULT.get(name, repr(parameters[name].default).replace("'", '"'))
        assert default == expected, name
