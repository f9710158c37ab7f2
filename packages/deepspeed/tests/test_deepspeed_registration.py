"""The names this package registers, and that finding them imports nothing heavy."""

from __future__ import annotations

import subprocess
import sys

import pytest

from stratagem import registry
from stratagem.registry.first_party import PACKAGES
from stratagem_deepspeed.registration import REQUIREMENT, STRATEGY_ALIASES

pytestmark = pytest.mark.timeout(120)


def test_the_aliases_are_those_users_know_and_core_catalogues():
    [catalogued] = [package for package in PACKAGES if package.distribution == "stratagem-deepspeed"]
    assert tuple(STRATEGY_ALIASES) == catalogued.names["strategy"]
    for name in STRATEGY_ALIASES:
        description = registry.strategies.describe(name)
        assert description.distribution == "stratagem-deepspeed"
        assert description.requires == REQUIREMENT
        assert description.target == "stratagem_deepspeed.strategy:DeepSpeedStrategy"


def test_the_checkpoint_reader_is_registered():
    description = registry.checkpoint_io.describe("deepspeed")
    assert description.target == "stratagem_deepspeed.checkpoint_io:DeepSpeedCheckpointIO"
    assert description.available


def test_discovering_every_plugin_and_asking_readers_imports_neither_deepspeed_nor_the_strategy(tmp_path):
    probe = f"""
import sys
from stratagem import registry
from stratagem.checkpoint_io import readers
for kind in registry.ALL:
    kind.names()
from stratagem_deepspeed.checkpoint_io import DeepSpeedCheckpointIO
assert not DeepSpeedCheckpointIO.can_read({str(tmp_path)!r})
heavy = sorted(name for name in ("deepspeed", "stratagem_deepspeed.strategy") if name in sys.modules)
assert not heavy, heavy
"""
    subprocess.run([sys.executable, "-c", probe], check=True, timeout=60)


def test_importing_the_package_imports_neither_torch_nor_deepspeed():
    probe = "import sys, stratagem_deepspeed; assert 'torch' not in sys.modules and 'deepspeed' not in sys.modules"
    subprocess.run([sys.executable, "-c", probe], check=True, timeout=60)
