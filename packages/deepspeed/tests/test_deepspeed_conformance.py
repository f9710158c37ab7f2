"""The core conformance kit, applied to ZeRO stages 2 and 3 (and stage 3 offloaded to CPU).

Each class is one fresh script run by the kit: fit, validate from its checkpoint, and a resumed fit
by new Trainers in the same processes, so it also checks that one run's teardown leaves DeepSpeed
ready for the next.
"""

import pytest

from stratagem.testing.conformance import StrategyConformance

pytestmark = pytest.mark.distributed


class TestDeepSpeedStage2Conforms(StrategyConformance):
    strategy = "deepspeed_stage_2"
    devices = 2
    timeout = 900


class TestDeepSpeedStage3Conforms(StrategyConformance):
    strategy = "deepspeed_stage_3"
    devices = 2
    timeout = 900


class TestDeepSpeedStage3OffloadConforms(StrategyConformance):
    strategy = "deepspeed_stage_3_offload"
    devices = 2
    timeout = 900


class TestDeepSpeedStage3ConformsInBf16(StrategyConformance):
    # DeepSpeed's bf16 mode: bf16 module, fp32 master weights. Its weights differ from fp32 single_device
    # training by what bf16 rounds, so they are not compared; everything else is, resume bit for bit.
    strategy = "deepspeed_stage_3"
    devices = 2
    precision = "bf16-mixed"
    tolerance = None
    timeout = 900
