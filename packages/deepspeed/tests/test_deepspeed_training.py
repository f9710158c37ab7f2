"""Training with 2 real CPU processes (gloo) through DeepSpeed's engine, driven as the Trainer drives it.

Every run starts from the same weights and sees the same global batches as a plain
single-process reference, so ZeRO's sharding must reproduce its losses and weights.
Ops compiled here: deepspeed_shm_comm (every run) and cpu_adam (one test).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import pytest
import torch
from deepspeed_testing import (
    LEARNING_RATE,
    OP_BUILD_TIMEOUT,
    RegressionNet,
    create_strategy,
    global_batches,
    initial_weights,
    rank_slice,
    reference_run,
    reference_setup,
    set_up,
    train,
    train_steps,
    worker_pool,
)

from stratagem.checkpoint_io import TorchCheckpointIO
from stratagem.strategies import LoopSettings
from stratagem_deepspeed.registration import STRATEGY_ALIASES

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]

STEPS = 4
ALIASES_WITHOUT_NVME = [name for name in STRATEGY_ALIASES if not name.endswith("_nvme")]


@pytest.fixture(scope="module")
def workers():
    with worker_pool() as pool:
        yield pool


@pytest.fixture(scope="module")
def reference():
    return reference_run(STEPS)


def _assert_matches_reference(result, reference, tolerance):
    losses, weights, _ = result
    reference_losses, reference_weights = reference
    assert losses == pytest.approx(reference_losses, abs=tolerance)
    assert set(weights) == set(reference_weights)
    for name, value in reference_weights.items():
        assert weights[name].dtype == value.dtype, name
        torch.testing.assert_close(weights[name], value, atol=tolerance, rtol=0, msg=name)


@pytest.mark.parametrize("alias", ALIASES_WITHOUT_NVME)
def test_every_alias_trains_like_one_process_on_the_global_batch_in_fp32(workers, reference, alias):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rank_zero, rank_one = workers.run(train, alias, STEPS)
    assert rank_one[1] == {}, "only rank 0 receives the gathered weights"
    _assert_matches_reference(rank_zero, reference, tolerance=1e-5)


@pytest.fixture(scope="module")
def ddp_run(workers):
    return workers.run(train, "ddp", STEPS)[0]


@pytest.mark.parametrize("alias", ["deepspeed_stage_1", "deepspeed_stage_2"])
def test_stage_1_and_2_match_ddp_on_the_same_global_batch(workers, ddp_run, alias):
    ddp_losses, ddp_weights, _ = ddp_run
    losses, weights, _ = workers.run(train, alias, STEPS)[0]
    assert losses == pytest.approx(ddp_losses, abs=1e-6)
    for name, value in ddp_weights.items():
        torch.testing.assert_close(weights[name], value, atol=1e-6, rtol=0, msg=name)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_bf16_mixed_trains_every_stage_close_to_fp32_with_fp32_master_weights(workers, reference, stage):
    losses, weights, _ = workers.run(train, {"stage": stage}, STEPS, "bf16-mixed")[0]
    assert all(math.isfinite(loss) for loss in losses)
    # bf16 compute keeps ~3 significant digits; the fp32 master weights stay fp32.
    assert losses == pytest.approx(reference[0], rel=5e-2)
    assert all(value.dtype == torch.float32 for name, value in weights.items() if name != "calls")


def _module_dtype_under_bf16(stage: int) -> str:
    strategy = create_strategy({"stage": stage}, "bf16-mixed")
    model, _ = set_up(strategy)
    return str(next(model.parameters()).dtype)


def test_bf16_runs_the_module_in_bf16(workers):
    assert workers.run(_module_dtype_under_bf16, 2) == ["torch.bfloat16", "torch.bfloat16"]


def _partitioning_of_a_module_built_in_the_init_context() -> tuple[bool, list[int], int, int]:
    strategy = create_strategy("deepspeed_stage_3")
    with strategy.module_init_context():
        model = torch.nn.Linear(64, 32)
    built_on_meta = all(parameter.is_meta for parameter in model.parameters())
    strategy.setup_module(model)
    shapes = [parameter.numel() for parameter in model.parameters()]
    held = sum(parameter.ds_tensor.numel() for parameter in model.parameters())
    total = sum(parameter.ds_numel for parameter in model.parameters())
    return built_on_meta, shapes, held, total


def test_stage_3_builds_the_module_on_rank_zero_and_partitions_it_each_rank_holding_half(workers):
    results = workers.run(_partitioning_of_a_module_built_in_the_init_context)
    assert [built_on_meta for built_on_meta, *_ in results] == [False, True], "only rank 0 builds it"
    for _, shapes, held, total in results:
        assert shapes == [0, 0], "setup_module partitions the parameters"
        assert total == 64 * 32 + 32
        assert held == total // 2


class _InitialisedAfterConstruction(torch.nn.Module):
    """Built as Hugging Face models are: layers created, then re-initialised (post_init), an output tied to the
    embedding, a parameter without reset_parameters and a buffer computed at construction."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(10, 8)
        self.scale = torch.nn.Parameter(torch.randn(8))
        self.head = torch.nn.Linear(8, 10, bias=False)
        self.head.weight = self.embedding.weight
        self.register_buffer("table", torch.arange(8.0).sqrt(), persistent=False)
        torch.nn.init.normal_(self.embedding.weight, std=0.02)


def _stage_3_weights_and_buffers_of_a_module_initialised_after_construction():
    strategy = create_strategy("deepspeed_stage_3")
    torch.manual_seed(0)
    with strategy.module_init_context():
        model = _InitialisedAfterConstruction()
    strategy.setup_module(model)
    strategy.setup_optimizers([torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)])
    tied = model.head.weight is model.embedding.weight
    return strategy.module_full_state_dict(), dict(model.named_buffers()), tied


def test_stage_3_starts_from_the_eager_build_of_a_module_initialised_after_construction(workers):
    results = workers.run(_stage_3_weights_and_buffers_of_a_module_initialised_after_construction)
    torch.manual_seed(0)
    eager = _InitialisedAfterConstruction()
    weights = results[0][0]
    assert weights.keys() == eager.state_dict().keys()
    for name, value in eager.state_dict().items():
        assert torch.equal(weights[name], value), name
    for _, buffers, tied in results:
        assert torch.equal(buffers["table"], eager.table)
        assert tied


class _UnregisteredTable(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.table = torch.randn(4)


def _stage_3_set_up_of_a_module_holding_an_unregistered_tensor():
    strategy = create_strategy("deepspeed_stage_3")
    with strategy.module_init_context():
        model = _UnregisteredTable()
    try:
        strategy.setup_module(model)
    except ValueError as error:
        return str(error)
    return None


def test_stage_3_refuses_a_tensor_outside_parameters_and_buffers_on_every_rank_naming_it(workers):
    rank_zero, rank_one = workers.run(_stage_3_set_up_of_a_module_holding_an_unregistered_tensor)
    assert rank_zero == rank_one
    assert "rank 1: table" in rank_zero
    assert "register_buffer" in rank_zero


def _train_with_cpu_adam_recording_warnings() -> tuple[tuple, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = train("deepspeed_stage_2_offload", STEPS, "32-true", "cpu_adam")
    return result, [str(warning.message) for warning in caught if "DeepSpeedCPUAdam" in str(warning.message)]


def test_deepspeed_cpu_adam_with_offload_matches_torch_adamw_without_a_warning(workers, reference):
    # The one test that compiles cpu_adam: the optimizer offload users are pointed to.
    result, warned = workers.run(_train_with_cpu_adam_recording_warnings, timeout=OP_BUILD_TIMEOUT)[0]
    assert result[2] == "DeepSpeedCPUAdam"
    assert warned == []
    _assert_matches_reference(result, reference, tolerance=1e-5)


def _warnings_when_offloading_torch_adamw() -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        strategy = create_strategy("deepspeed_stage_3_offload")
        set_up(strategy)
    return [str(warning.message) for warning in caught if "DeepSpeedCPUAdam" in str(warning.message)]


def test_offloading_a_torch_adamw_warns_once_pointing_to_deepspeed_cpu_adam(workers):
    rank_zero, rank_one = workers.run(_warnings_when_offloading_torch_adamw)
    assert len(rank_zero) == 1
    assert "deepspeed.ops.adam.DeepSpeedCPUAdam" in rank_zero[0]
    assert rank_one == [], "one warning per run, from rank 0"


def _train_with_config_optimizer_and_scheduler() -> tuple[str, list[float]]:
    config = {
        "zero_optimization": {"stage": 2},
        "zero_allow_untested_optimizer": True,
        "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
        "scheduler": {
            "type": "WarmupLR",
            "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 0.1, "warmup_num_steps": 4},
        },
    }
    strategy = create_strategy({"config": config})
    model, optimizers = set_up(strategy, "from_config")
    learning_rates = []
    for step in range(3):
        train_steps(strategy, model, optimizers, 1, start_step=step)
        learning_rates.append(optimizers[0].param_groups[0]["lr"])
    return type(optimizers[0]).__name__, learning_rates


def test_optimizer_and_scheduler_from_the_config_train_and_the_engine_steps_the_scheduler(workers):
    name, learning_rates = workers.run(_train_with_config_optimizer_and_scheduler)[0]
    assert name == "SGD"
    assert learning_rates == sorted(learning_rates)
    assert learning_rates[0] < learning_rates[-1] <= 0.1


def _gradient_accumulation(accumulate: int) -> tuple[list[int], list[float]]:
    settings = LoopSettings(accumulate_grad_batches=accumulate)
    strategy = create_strategy("deepspeed_stage_2", settings=settings)
    model, optimizers = set_up(strategy)
    steps_taken = []
    for step in range(2 * accumulate):
        train_steps(strategy, model, optimizers, 1, start_step=step)
        steps_taken.append(strategy.engine.global_steps)
    return steps_taken, [value.sum().item() for value in strategy.module_full_state_dict().values()]


def test_the_engine_accumulates_gradients_over_the_trainers_batches(workers):
    steps_taken, _ = workers.run(_gradient_accumulation, 2)[0]
    assert steps_taken == [0, 1, 1, 2], "one optimizer step per 2 batches, counted by the engine"


def _train_in_windows(windows: list[int]) -> tuple[list[int], dict[str, torch.Tensor]]:
    # As the Trainer drives it: the boundary is set on every batch, so a window may end early.
    strategy = create_strategy("deepspeed_stage_2", settings=LoopSettings(accumulate_grad_batches=max(windows)))
    _, optimizers = set_up(strategy)
    batches = iter(global_batches(sum(windows), strategy.world_size))
    steps_after_each_window = []
    for window in windows:
        for position in range(window):
            strategy.set_accumulation_boundary(position == window - 1)
            local = strategy.batch_to_device(rank_slice(next(batches), strategy.global_rank))
            strategy.backward(strategy.run_step("training_step", local), optimizers[0])
            strategy.optimizer_step(optimizers[0])
        steps_after_each_window.append(strategy.engine.global_steps)
    return steps_after_each_window, strategy.module_full_state_dict()


def test_a_window_the_epoch_cuts_short_is_stepped_and_the_next_window_starts_afresh(workers):
    # accumulate_grad_batches=3 over two epochs of 4 batches: windows of 3, 1, 3, 1.
    windows = [3, 1, 3, 1]
    steps, weights = workers.run(_train_in_windows, windows)[0]
    assert steps == [1, 2, 3, 4]
    model, optimizer = reference_setup()
    batches = iter(global_batches(sum(windows)))
    for window in windows:
        for _ in range(window):
            # Like the Trainer's own accumulation: every micro-batch's loss is divided by accumulate_grad_batches.
            (model.training_step(next(batches)) / max(windows)).backward()
        optimizer.step()
        optimizer.zero_grad()
    for name, value in model.state_dict().items():
        torch.testing.assert_close(weights[name], value, atol=1e-5, rtol=0, msg=name)


def _clipping_run(clip: float | None) -> float:
    settings = LoopSettings(gradient_clip_val=clip)
    strategy = create_strategy("deepspeed_stage_2", settings=settings)
    model, optimizers = set_up(strategy)
    if clip is not None:
        assert strategy.clip_gradients(optimizers[0], clip) is None
    train_steps(strategy, model, optimizers, 1)
    return float(strategy.config["gradient_clipping"])


def test_the_trainers_gradient_clip_val_reaches_the_engine(workers):
    assert workers.run(_clipping_run, 0.5)[0] == 0.5
    assert workers.run(_clipping_run, None)[0] == 0.0


def _evaluate_without_fit(alias: str, checkpoint: str) -> tuple[float, dict[str, torch.Tensor]]:
    # What Trainer.validate(ckpt_path=...) does: no optimizer, weights loaded, then steps run.
    strategy = create_strategy(alias)
    with strategy.module_init_context(empty_init=True):
        model = RegressionNet()
    strategy.setup_module(model)
    strategy.load_checkpoint(checkpoint, {"module": model})
    batch = strategy.batch_to_device(rank_slice(global_batches(1)[0], strategy.global_rank))
    with torch.no_grad():
        loss = strategy.run_step("training_step", batch)
    return strategy.reduce(loss.float(), "mean").item(), strategy.module_full_state_dict()


@pytest.mark.parametrize("alias", ["deepspeed_stage_2", "deepspeed_stage_3"])
def test_evaluation_without_fit_runs_on_an_engine_without_optimizer(workers, reference, tmp_path, alias):
    weights = initial_weights()
    TorchCheckpointIO().save_checkpoint({"module": weights}, tmp_path / "initial.pt")
    loss, gathered = workers.run(_evaluate_without_fit, alias, str(tmp_path / "initial.pt"))[0]
    assert loss == pytest.approx(reference[0][0], abs=1e-6), "the loss of the initial weights on the first batch"
    for name, value in weights.items():
        assert torch.equal(gathered[name], value), name


def _second_optimizer_error() -> str:
    strategy = create_strategy("deepspeed_stage_2")
    model = torch.nn.Linear(2, 2)
    strategy.setup_module(model)
    try:
        strategy.setup_optimizers([torch.optim.SGD(model.parameters(), lr=0.1) for _ in range(2)])
    except ValueError as error:
        return str(error)
    return "no error"


def test_a_second_optimizer_is_refused_naming_the_limit(workers):
    message = workers.run(_second_optimizer_error)[0]
    assert "at most 1 optimizer" in message
    assert "returned 2" in message


def _optimizer_problem(config_optimizer: bool, client_optimizer: bool) -> str:
    config: dict[str, Any] = {"zero_optimization": {"stage": 1}, "zero_allow_untested_optimizer": True}
    if config_optimizer:
        config["optimizer"] = {"type": "SGD", "params": {"lr": 0.1}}
    strategy = create_strategy({"config": config})
    model = torch.nn.Linear(2, 2)
    strategy.setup_module(model)
    try:
        strategy.setup_optimizers([torch.optim.SGD(model.parameters(), lr=0.1)] if client_optimizer else [])
    except ValueError as error:
        return str(error)
    return "no error"


def test_an_optimizer_both_in_the_config_and_from_configure_optimizers_is_refused(workers):
    message = workers.run(_optimizer_problem, True, True)[0]
    assert "'optimizer' section" in message
    assert "SGD" in message


def test_no_optimizer_anywhere_is_refused_saying_where_one_can_come_from(workers):
    message = workers.run(_optimizer_problem, False, False)[0]
    assert "configure_optimizers" in message
    assert "'optimizer' section" in message
