from torch import nn

import stratagem
from stratagem.planning import model_footprint
from stratagem_ddp import DDPStrategy


def _footprint():
    return model_footprint(nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64)))[0]


def test_ddp_counts_the_reducer_buckets_as_a_second_copy_of_the_gradients():
    footprint = _footprint()
    strategy = stratagem.resolve(accelerator="cpu", strategy="ddp", devices=2)
    estimate = strategy.estimate_memory(footprint)
    assert estimate.device_bytes == footprint.training_state_bytes + footprint.gradient_bytes


def test_ddp_with_gradients_as_bucket_views_holds_one_copy():
    footprint = _footprint()
    strategy = stratagem.resolve(accelerator="cpu", strategy=DDPStrategy(gradient_as_bucket_view=True), devices=2)
    assert strategy.estimate_memory(footprint).device_bytes == footprint.training_state_bytes
