"""The core conformance kit, applied to hpu_single and hpu_parallel on the stand-in's cards."""

import pytest

from stratagem.testing.conformance import StrategyConformance

pytestmark = pytest.mark.distributed


class TestHPUSingleConforms(StrategyConformance):
    strategy = "hpu_single"
    accelerator = "hpu"
    devices = 1
    timeout = 300


class TestHPUParallelConforms(StrategyConformance):
    strategy = "hpu_parallel"
    accelerator = "hpu"
    devices = 2
    timeout = 400
