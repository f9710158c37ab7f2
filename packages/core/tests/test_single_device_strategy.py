import pytest
import torch
from torch import nn

import stratagem
from stratagem.strategies import SingleDeviceStrategy


class _Counting(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(3, 1)
        self.forward_calls = 0

    def forward(self, x):
        self.forward_calls += 1
        return self.layer(x)

    def training_step(self, batch, batch_idx):
        return self(batch).sum() + batch_idx


def _strategy(**options):
    return stratagem.resolve(accelerator="cpu", devices=1, **options)


def test_single_device_collectives_are_identities():
    strategy = _strategy()
    tensor = torch.tensor([1.0, 2.0])
    assert strategy.reduce(tensor, "sum") is tensor
    assert strategy.all_gather(tensor).shape == (1, 2)
    assert strategy.broadcast({"a": 1}) == {"a": 1}
    strategy.barrier("nothing to wait for")
    assert strategy.reduce_boolean(True) is True
    assert strategy.world_size == 1
    assert strategy.is_global_zero


def test_single_device_refuses_more_than_one_device_with_a_clear_message():
    with pytest.raises(ValueError, match=r"single_device.*exactly one device"):
        stratagem.resolve(accelerator="cpu", strategy="single_device", devices=2)


def test_run_step_calls_the_step_and_the_inner_forward_once():
    strategy = _strategy()
    module = strategy.setup_module(_Counting())
    loss = strategy.run_step("training_step", torch.ones(2, 3), 5)
    assert module.forward_calls == 1
    assert loss.requires_grad


def test_run_step_routes_through_forward_hooks_and_restores_forward():
    strategy = _strategy()
    module = strategy.setup_module(_Counting())
    seen = []
    module.register_forward_pre_hook(lambda mod, args: seen.append(len(args)))
    strategy.run_step("training_step", torch.ones(2, 3), 0)
    # The redirected call and the step's own self(x) both pass through the hooks.
    assert seen == [2, 1]
    assert "forward" not in module.__dict__
    assert module(torch.ones(1, 3)).shape == (1, 1)


def test_module_init_context_creates_parameters_in_the_precision_dtype():
    strategy = _strategy(precision="64-true")
    with strategy.module_init_context():
        layer = nn.Linear(2, 2)
    assert layer.weight.dtype == torch.float64
    assert torch.get_default_dtype() == torch.float32


def test_empty_init_skips_initialisation_functions():
    strategy = _strategy()
    torch.manual_seed(0)
    with strategy.module_init_context(empty_init=False):
        initialised = nn.Linear(64, 64)
    torch.manual_seed(0)
    state = torch.random.get_rng_state()
    with strategy.module_init_context(empty_init=True):
        nn.Linear(64, 64)
    # No random init ran, so the generator did not move.
    assert torch.equal(torch.random.get_rng_state(), state)
    assert initialised.weight.abs().sum() > 0


def test_save_and_load_checkpoint_round_trip_module_optimizer_and_plain_entries(tmp_path):
    strategy = _strategy()
    module = strategy.setup_module(_Counting())
    optimizer = torch.optim.Adam(module.parameters(), lr=0.1)
    strategy.run_step("training_step", torch.ones(2, 3), 0).backward()
    strategy.optimizer_step(optimizer)
    path = tmp_path / "state.ckpt"
    strategy.save_checkpoint(path, {"module": module, "optimizers": [optimizer], "loops": {"step": 7}})

    fresh = _Counting()
    fresh_optimizer = torch.optim.Adam(fresh.parameters(), lr=0.1)
    remaining = strategy.load_checkpoint(path, {"module": fresh, "optimizers": [fresh_optimizer]})
    assert remaining == {"loops": {"step": 7}}
    for a, b in zip(module.state_dict().values(), fresh.state_dict().values()):
        assert torch.equal(a, b)
    assert fresh_optimizer.state_dict()["state"][0]["step"] == 1


def test_too_many_optimizers_for_a_strategy_is_a_clear_error():
    class OneOptimizer(SingleDeviceStrategy):
        max_optimizers = 1

    strategy = stratagem.resolve(accelerator="cpu", strategy=OneOptimizer())
    module = strategy.setup_module(nn.Linear(1, 1))
    optimizers = [torch.optim.SGD(module.parameters(), lr=1.0) for _ in range(2)]
    with pytest.raises(ValueError, match="at most 1 optimizer"):
        strategy.setup_optimizers(optimizers)
