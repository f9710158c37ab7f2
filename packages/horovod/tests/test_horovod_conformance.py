"""The core conformance kit, applied to horovod (2 CPU processes, horovod's Gloo)."""

import pytest

from stratagem.testing.conformance import StrategyConformance

pytestmark = pytest.mark.distributed


class TestHorovodConforms(StrategyConformance):
    strategy = "horovod"
    devices = 2
    timeout = 400
