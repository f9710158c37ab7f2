"""Puts the CPU stand-in of Habana's ``habana_frameworks`` (``standin/``) on the path of this process and of every
process it starts, so that stratagem-hpu runs here as it would on a Gaudi machine. Tests of a machine without
Habana's software patch :func:`stratagem_hpu.availability.habana_problem` or start a process without it."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

STANDIN = str(Path(__file__).with_name("standin"))

sys.path.insert(0, STANDIN)
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [STANDIN, os.environ.get("PYTHONPATH")]))
# DeepSpeed picks its HPU accelerator wherever habana_frameworks imports; the stand-in's cards compute on the CPU.
os.environ.setdefault("DS_ACCELERATOR", "cpu")

_HABANA_VARIABLES = ("PT_HPU_LAZY_MODE", "HABANA_STANDIN_RECORD", "HABANA_STANDIN_FP8", "HABANA_STANDIN_DEVICES")


@pytest.fixture(autouse=True)
def habana_variables_restored() -> Iterator[None]:
    """The strategies set ``PT_HPU_LAZY_MODE`` for the ranks they start: no test sees another's."""
    saved = {name: os.environ.pop(name, None) for name in _HABANA_VARIABLES}
    yield
    for name, value in saved.items():
        os.environ.pop(name, None)
        if value is not None:
            os.environ[name] = value


@pytest.fixture
def habana_calls() -> Iterator[list[dict[str, object]]]:
    """The calls the stand-in records in this process during the test."""
    import habana_frameworks

    habana_frameworks.calls.clear()
    yield habana_frameworks.calls
    habana_frameworks.calls.clear()
