"""A whole checkpoint whose optimizer keeps no per-parameter state (SGD without momentum) resumes under fsdp
on two ranks, with the saved hyperparameters, and trains on as one plain process does from it."""

import pytest
import torch
from fsdp_testing import Block, Net, global_batches, local_part, make_strategy

from stratagem.checkpoint_io import TorchCheckpointIO
from stratagem.testing import DistributedWorkers

pytestmark = pytest.mark.timeout(120)

SAVED_LR = 0.1
BATCHES = global_batches(3)


def _single_process_run(path, per_parameter_entries):
    """Train one step with SGD (no momentum: an empty ``state``), save as single_device does (or with an empty
    entry per parameter, as the deepspeed reader gathers it from stage-3 shards), then go on."""
    torch.manual_seed(0)
    module = Net()
    optimizer = torch.optim.SGD(module.parameters(), lr=SAVED_LR)

    def step(batch):
        module.training_step(batch).backward()
        optimizer.step()
        optimizer.zero_grad()

    step(BATCHES[0])
    optimizer_state = optimizer.state_dict()
    assert optimizer_state["state"] == {}
    if per_parameter_entries:
        optimizer_state["state"] = {index: {} for index in optimizer_state["param_groups"][0]["params"]}
    TorchCheckpointIO().save_checkpoint({"module": module.state_dict(), "optimizers": [optimizer_state]}, path)
    for batch in BATCHES[1:]:
        step(batch)
    return {name: value.detach().clone() for name, value in module.state_dict().items()}


def _resume_under_fsdp(path):
    strategy = make_strategy(auto_wrap_policy={Block})
    torch.manual_seed(1)  # other initial weights: the checkpoint must replace them
    module = Net()
    strategy.setup_module(module)
    # Another learning rate: the checkpoint's must replace it too.
    [optimizer] = strategy.setup_optimizers([torch.optim.SGD(module.parameters(), lr=10 * SAVED_LR)])
    strategy.load_checkpoint(path, {"module": module, "optimizers": [optimizer]})
    learning_rate = optimizer.param_groups[0]["lr"]
    for batch in BATCHES[1:]:
        loss = strategy.run_step("training_step", local_part(batch))
        strategy.backward(loss, optimizer)
        strategy.optimizer_step(optimizer)
        strategy.zero_grad(optimizer)
    return learning_rate, strategy.module_full_state_dict()


@pytest.fixture(scope="module")
def workers():
    with DistributedWorkers(2, env={"OMP_NUM_THREADS": "1"}) as pool:
        yield pool


@pytest.mark.parametrize("saved_state", ["empty", "an empty entry per parameter"])
def test_a_checkpoint_of_a_stateless_optimizer_resumes_under_fsdp_and_trains_as_one_process(
    workers, tmp_path, saved_state
):
    path = tmp_path / "saved.ckpt"
    expected = _single_process_run(path, per_parameter_entries=saved_state != "empty")
    results = workers.run(_resume_under_fsdp, str(path))
    assert [learning_rate for learning_rate, _ in results] == [SAVED_LR, SAVED_LR]
    weights = results[0][1]
    assert weights.keys() == expected.keys()
    for name, value in expected.items():
        torch.testing.assert_close(weights[name], value, rtol=1e-5, atol=1e-6, msg=name)
