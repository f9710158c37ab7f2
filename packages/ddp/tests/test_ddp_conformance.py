"""The core conformance kit, applied to ddp and ddp_spawn (the two launch paths)."""

import pytest

from stratagem.testing.conformance import StrategyConformance

pytestmark = pytest.mark.distributed


class TestDDPConforms(StrategyConformance):
    strategy = "ddp"
    devices = 2
    timeout = 300


class TestDDPSpawnConforms(StrategyConformance):
    strategy = "ddp_spawn"
    devices = 2
    timeout = 300
