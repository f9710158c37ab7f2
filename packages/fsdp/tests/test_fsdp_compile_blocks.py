"""What ``fsdp`` compiles when ``Trainer(compile=...)`` names no blocks: its wrap policy's units."""

from __future__ import annotations

import functools

from torch import nn
from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy

from stratagem_fsdp import FSDPStrategy


def test_the_blocks_compiled_by_default_are_the_wrap_policys_units():
    policy = FSDPStrategy(auto_wrap_policy={nn.TransformerEncoderLayer}).compile_blocks()
    assert policy is not None
    assert policy(nn.TransformerEncoderLayer(8, 2, dim_feedforward=16))
    assert not policy(nn.Linear(8, 8))


def test_a_size_based_wrap_policy_picks_the_compiled_blocks_by_their_parameter_count():
    wrap = functools.partial(size_based_auto_wrap_policy, min_num_params=100)
    policy = FSDPStrategy(auto_wrap_policy=wrap).compile_blocks()
    assert policy is not None
    assert policy(nn.Linear(16, 16))
    assert not policy(nn.Linear(2, 2))


def test_without_a_wrap_policy_the_whole_forward_is_compiled():
    assert FSDPStrategy().compile_blocks() is None
