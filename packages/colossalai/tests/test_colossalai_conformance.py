"""The core conformance kit, applied to colossalai with its DDP plugin (the one ColossalAI runs on CPU)."""

import pytest

from stratagem.testing.conformance import StrategyConformance

pytestmark = pytest.mark.distributed


class TestColossalAIDDPPluginConforms(StrategyConformance):
    strategy = "colossalai"
    devices = 2
    timeout = 400
