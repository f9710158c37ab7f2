"""The core conformance kit, applied to ddp (ddp_spawn and ddp_fork: test_ddp_trainer_equivalence.py)."""

import pytest

from stratagem.testing.conformance import StrategyConformance

pytestmark = pytest.mark.distributed


class TestDDPConforms(StrategyConformance):
    strategy = "ddp"
    devices = 2
    timeout = 300
