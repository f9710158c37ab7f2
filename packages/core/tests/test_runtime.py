"""stratagem.Runtime on one process: the documented own loop trains as the raw loop and the Trainer do, its
checkpoints go to the Trainer and back, and what cannot work is refused before anything runs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional
from torch.utils.data import DataLoader

import stratagem
from stratagem import Trainer
from stratagem.callbacks import Callback
from stratagem.demo import DemoModule, make_classification
from stratagem.runtime import RuntimeOptimizer
from stratagem.strategies import (
    EngineSteps,
    LoopSettings,
    OwnsAccumulation,
    OwnsTrainingStep,
    SingleDeviceStrategy,
    TakesLoopSettings,
)

OWN_LOOP_EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "own_loop"
SAMPLES, BATCH, SEED = 256, 32, 1234


@pytest.fixture
def examples(monkeypatch):
    monkeypatch.syspath_prepend(str(OWN_LOOP_EXAMPLE))
    import raw_loop
    import runtime_loop

    yield raw_loop, runtime_loop
    for name in ("raw_loop", "runtime_loop"):
        sys.modules.pop(name, None)


class _RecordLosses(Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        self.losses.append(float(outputs.detach()))


def _trainer(**options) -> Trainer:
    settings = {
        "strategy": "single_device",
        "accelerator": "cpu",
        "devices": 1,
        "max_epochs": 1,
        "seed": SEED,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "num_sanity_val_steps": 0,
    }
    settings.update(options)
    return Trainer(**settings)


def _loader() -> DataLoader:
    return DataLoader(make_classification(SAMPLES), batch_size=BATCH)


def _runtime() -> stratagem.Runtime:
    return stratagem.Runtime(strategy="single_device", accelerator="cpu", devices=1)


def _weights(module: nn.Module) -> dict[str, torch.Tensor]:
    return {name: value.detach().clone() for name, value in module.state_dict().items()}


def _assert_close(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> None:
    assert first.keys() == second.keys()
    for name in first:
        torch.testing.assert_close(first[name], second[name], rtol=0, atol=1e-5, msg=name)


def _trained_with_runtime(runtime, train):
    losses = train(runtime, samples=SAMPLES, batch_size=BATCH, seed=SEED)
    return losses, _weights(runtime.strategy.module)


def test_the_documented_own_loop_trains_as_the_raw_loop_and_as_the_trainer_on_single_device(examples):
    raw_loop, runtime_loop = examples
    raw_losses = raw_loop.train(samples=SAMPLES, batch_size=BATCH, seed=SEED)
    own_losses, own_weights = _runtime().launch(_trained_with_runtime, runtime_loop.train)
    assert own_losses == raw_losses
    recorder = _RecordLosses()
    module = DemoModule()
    steps = SAMPLES // BATCH
    _trainer(max_steps=steps, callbacks=[recorder]).fit(module, _loader())
    assert len(recorder.losses) == steps
    torch.testing.assert_close(torch.tensor(own_losses), torch.tensor(recorder.losses), rtol=0, atol=1e-5)
    _assert_close(own_weights, _weights(module))


def _built_in_init_module(runtime):
    torch.manual_seed(SEED)
    loader = runtime.setup_dataloaders(_loader())
    with runtime.init_module():
        model = DemoModule()
        model.configure_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=model.learning_rate, weight_decay=0.01)
    model, optimizer = runtime.setup(model, optimizer)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=len(loader))
    losses = []
    for features, labels in loader:
        loss = functional.cross_entropy(model(features), labels)
        runtime.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
        losses.append(loss.item())
    return losses, _weights(runtime.strategy.module)


@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed", "bf16-true"])
def test_an_own_loop_trains_as_the_trainer_in_reduced_precision(precision):
    # The loss is computed outside the module's forward: under autocast its outputs come back in fp32, so the loss
    # computes as the Trainer's training_step does inside autocast. init_module builds as configure_model is built.
    runtime = stratagem.Runtime(strategy="single_device", accelerator="cpu", devices=1, precision=precision)
    own_losses, own_weights = runtime.launch(_built_in_init_module)
    recorder = _RecordLosses()
    module = DemoModule()
    _trainer(max_steps=SAMPLES // BATCH, callbacks=[recorder], precision=precision).fit(module, _loader())
    torch.testing.assert_close(torch.tensor(own_losses), torch.tensor(recorder.losses), rtol=0, atol=1e-5)
    _assert_close(own_weights, _weights(module))


def _own_loop_steps(runtime, checkpoint_in, checkpoint_out, first_batch, steps):
    """The demo's own loop resumed from ``checkpoint_in`` (when given) at ``first_batch`` for ``steps`` steps, saved
    to ``checkpoint_out`` as the Trainer's entries (module, optimizers, lr_schedulers)."""
    torch.manual_seed(SEED)
    model = DemoModule()
    model.configure_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=model.learning_rate, weight_decay=0.01)
    model, optimizer = runtime.setup(model, optimizer)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=2 * steps)
    state = {"module": model, "optimizers": [optimizer], "lr_schedulers": [scheduler]}
    if checkpoint_in is not None:
        runtime.load(checkpoint_in, state)
    loader = runtime.setup_dataloaders(_loader())
    for batch_idx, (features, labels) in enumerate(loader):
        if batch_idx < first_batch:
            continue
        if batch_idx == first_batch + steps:
            break
        runtime.backward(functional.cross_entropy(model(features), labels))
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
    if checkpoint_out is not None:
        runtime.save(checkpoint_out, state)
    return _weights(runtime.strategy.module)


def test_an_own_loop_checkpoint_resumes_in_the_trainer_as_in_the_own_loop(tmp_path):
    saved = tmp_path / "own.ckpt"
    _runtime().launch(_own_loop_steps, None, saved, 0, 2)
    expected = _runtime().launch(_own_loop_steps, saved, None, 0, 2)
    module = DemoModule()
    # Without loop state in it, the Trainer starts at the first batch again, from the saved weights,
    # optimizer and scheduler.
    _trainer(max_steps=2).fit(module, _loader(), ckpt_path=saved)
    _assert_close(_weights(module), expected)


class _SaveAtEnd(Callback):
    def __init__(self, path: Path) -> None:
        self.path = path

    def on_train_end(self, trainer, module) -> None:
        trainer.save_checkpoint(self.path)


def test_a_trainer_checkpoint_loads_into_the_own_loop_and_continues_as_the_trainer(tmp_path):
    saved = tmp_path / "trainer.ckpt"
    _trainer(max_steps=2, callbacks=[_SaveAtEnd(saved)]).fit(DemoModule(), _loader())
    resumed = DemoModule()
    _trainer(max_steps=4).fit(resumed, _loader(), ckpt_path=saved)
    continued = _runtime().launch(_own_loop_steps, saved, None, 2, 2)
    _assert_close(continued, _weights(resumed))


def _plain_values_and_stateful_objects(runtime, path):
    model = nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, optimizer = runtime.setup(model, optimizer)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    runtime.backward(model(torch.ones(1, 2)).sum())
    optimizer.step()
    scheduler.step()
    runtime.save(path, {"model": model, "optimizer": optimizer, "scheduler": scheduler, "step": 7})
    saved_weight = model.weight.detach().clone()
    with torch.no_grad():
        model.weight.zero_()
    scheduler.step()
    state = {"model": model, "optimizer": optimizer, "scheduler": scheduler, "step": 0}
    remaining = runtime.load(path, state)
    return (
        torch.equal(model.weight, saved_weight),
        state["step"],
        scheduler.get_last_lr(),
        bool(optimizer.state),
        sorted(remaining),
    )


def test_save_and_load_round_trip_modules_optimizers_schedulers_and_plain_values(tmp_path):
    same_weight, step, learning_rates, has_momentum, remaining = _runtime().launch(
        _plain_values_and_stateful_objects, tmp_path / "state.ckpt"
    )
    assert same_weight
    assert step == 7
    assert has_momentum
    assert learning_rates == [pytest.approx(0.05)]
    assert remaining == []


def _accumulate_or_not(runtime, accumulate):
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    model, optimizer = runtime.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    features = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))
    chunks = features.chunk(accumulate)
    for index, chunk in enumerate(chunks):
        with runtime.no_backward_sync(model, enabled=index < len(chunks) - 1):
            runtime.backward(model(chunk).pow(2).mean() / accumulate)
    norm = runtime.clip_gradients(optimizer, max_norm=1e9)
    optimizer.step()
    return _weights(runtime.strategy.module), float(norm)


def test_accumulating_under_no_backward_sync_steps_as_one_batch_does():
    whole, whole_norm = _runtime().launch(_accumulate_or_not, 1)
    accumulated, accumulated_norm = _runtime().launch(_accumulate_or_not, 2)
    _assert_close(accumulated, whole)
    assert accumulated_norm == pytest.approx(whole_norm, rel=1e-6)


def _collectives(runtime):
    value = torch.tensor([2.0])
    return (
        runtime.all_reduce({"a": value, "b": [value]}, op="sum"),
        runtime.all_gather(value).shape,
        runtime.broadcast("from rank 0"),
        runtime.device,
        (runtime.global_rank, runtime.world_size, runtime.is_global_zero),
    )


def test_collectives_and_ranks_on_one_process():
    reduced, gathered_shape, broadcast, device, ranks = _runtime().launch(_collectives)
    assert torch.equal(reduced["a"], torch.tensor([2.0]))
    assert torch.equal(reduced["b"][0], torch.tensor([2.0]))
    assert gathered_shape == (1, 1)
    assert broadcast == "from rank 0"
    assert device == torch.device("cpu")
    assert ranks == (0, 1, True)


def _optimizer_seen_by_a_scheduler(runtime):
    model = nn.Linear(2, 1)
    model, optimizer = runtime.setup(model, torch.optim.SGD(model.parameters(), lr=1.0))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda epoch: 0.5**epoch)
    runtime.backward(model(torch.ones(1, 2)).sum())
    optimizer.step()
    scheduler.step()
    return (
        isinstance(optimizer, torch.optim.SGD),
        isinstance(optimizer, RuntimeOptimizer),
        optimizer.optimizer.param_groups[0]["lr"],
    )


def test_a_set_up_optimizer_is_the_optimizers_class_and_schedulers_step_it():
    is_sgd, is_runtime_optimizer, learning_rate = _runtime().launch(_optimizer_seen_by_a_scheduler)
    assert is_sgd
    assert is_runtime_optimizer
    assert learning_rate == 0.5


def _hooked_calls(runtime):
    model = runtime.setup_module(nn.Linear(2, 1))
    seen_by_every_module_hook: list[str] = []
    handle = torch.nn.modules.module.register_module_forward_hook(
        lambda module, inputs, output: seen_by_every_module_hook.append(type(module).__name__)
    )
    try:
        model(torch.ones(1, 2))
    finally:
        handle.remove()
    seen_by_the_wrapper_hook: list[str] = []
    model.register_forward_pre_hook(lambda module, inputs: seen_by_the_wrapper_hook.append("called"))
    model.module.register_forward_hook(lambda module, inputs, output: output * 0 + 7.0)
    return seen_by_every_module_hook, seen_by_the_wrapper_hook, model(torch.ones(1, 2))


def test_hooks_on_every_module_the_set_up_module_and_the_users_module_run():
    seen_by_every_module_hook, seen_by_the_wrapper_hook, output = _runtime().launch(_hooked_calls)
    assert seen_by_every_module_hook == ["Linear", "RuntimeModule"]
    assert seen_by_the_wrapper_hook == ["called"]
    assert torch.equal(output, torch.full((1, 1), 7.0))


class _Affine(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(2))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return inputs * self.weight + 1


def _compiled_call(runtime, compile_the_wrapper):
    compiled_graphs = []

    def recording_backend(graph, example_inputs):
        compiled_graphs.append(graph)
        return graph.forward

    # A module of our own: dynamo leaves torch's built-in modules uncompiled when they are compiled alone.
    model = runtime.setup_module(_Affine())
    (model if compile_the_wrapper else model.module).compile(backend=recording_backend)
    output = model(torch.ones(1, 2))
    return len(compiled_graphs), output.shape


@pytest.mark.parametrize("compile_the_wrapper", [True, False], ids=["set-up-module", "users-module"])
def test_a_module_compiled_after_setup_runs_compiled(compile_the_wrapper):
    graphs, shape = _runtime().launch(_compiled_call, compile_the_wrapper)
    assert graphs == 1
    assert shape == (1, 2)


def _zero_grad_both_ways(runtime):
    model = nn.Linear(2, 1)
    model, optimizer = runtime.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    runtime.backward(model(torch.ones(1, 2)).sum())
    optimizer.zero_grad(set_to_none=False)
    kept_as_zeros = [parameter.grad for parameter in model.parameters()]
    optimizer.zero_grad()
    return kept_as_zeros, [parameter.grad for parameter in model.parameters()]


def test_zero_grad_zeroes_in_place_or_drops_gradients_as_the_optimizer_does():
    kept_as_zeros, dropped = _runtime().launch(_zero_grad_both_ways)
    assert all(grad is not None and not grad.any() for grad in kept_as_zeros)
    assert dropped == [None, None]


class _WholeStepEngine(SingleDeviceStrategy, OwnsTrainingStep):
    @property
    def optimizer_steps_per_call(self) -> int:
        return 1

    def run_training_steps(self, batch, batch_idx) -> EngineSteps:
        raise AssertionError("never called")


class _AccumulatingEngine(SingleDeviceStrategy, OwnsAccumulation, TakesLoopSettings):
    def __init__(self) -> None:
        super().__init__()
        self.boundaries: list[bool] = []

    def set_accumulation_boundary(self, is_boundary: bool) -> None:
        self.boundaries.append(is_boundary)


def _two_micro_batches_then_late_loaders(runtime):
    loader = runtime.setup_dataloaders(DataLoader(make_classification(8), batch_size=4))
    model = nn.Linear(32, 4)
    model, optimizer = runtime.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    for index, (features, labels) in enumerate(loader):
        with runtime.no_backward_sync(model, enabled=index == 0):
            runtime.backward(functional.cross_entropy(model(features), labels))
    optimizer.step()
    told = list(runtime.strategy.boundaries)
    runtime.connect_loop_settings(LoopSettings())  # as if no loader had been set up
    try:
        runtime.setup_dataloaders(DataLoader(make_classification(8), batch_size=4))
    except RuntimeError as refused:
        return told, runtime.strategy.loop_settings.train_batch_size, str(refused)
    return told, None, "not refused"


def test_an_engine_that_accumulates_is_told_each_window_and_the_batch_size_before_it_is_built():
    runtime = stratagem.Runtime(strategy=_AccumulatingEngine(), accelerator="cpu", devices=1)
    told, batch_size_after_reset, refusal = runtime.launch(_two_micro_batches_then_late_loaders)
    # no_backward_sync(enabled=True): not a boundary, also at backward; the last micro-batch is one.
    assert told == [False, True, True]
    assert batch_size_after_reset is None
    assert "Call runtime.setup_dataloaders(...) before runtime.setup(...)" in refusal


def test_a_strategy_whose_engine_runs_whole_steps_is_refused_naming_why():
    with pytest.raises(ValueError, match=r"cannot run in an own loop: its engine runs whole training steps"):
        stratagem.Runtime(strategy=_WholeStepEngine(), accelerator="cpu", devices=1)


def test_a_bad_runtime_argument_fails_before_anything_starts():
    with pytest.raises(ValueError, match="precision="):
        stratagem.Runtime(strategy="single_device", accelerator="cpu", precision="13-bits")


def test_a_layout_the_strategy_cannot_run_is_refused_in_the_calling_process():
    with pytest.raises(ValueError, match=r"layout=\(pp=1, dp_replicate=1, dp_shard=1, tp=2\) cannot run under"):
        stratagem.Runtime(strategy="single_device", accelerator="cpu", devices=1, layout={"dp_shard": 1, "tp": 2})


def _setup_optimizers_first(runtime):
    runtime.setup_optimizers(torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=0.1))


def test_setup_outside_launch_optimizers_before_the_module_and_backward_before_setup_are_refused():
    runtime = _runtime()
    with pytest.raises(RuntimeError, match=r"setup_module comes after the run has started"):
        runtime.setup(nn.Linear(1, 1))
    with pytest.raises(RuntimeError, match=r"setup_optimizers comes after setup_module"):
        runtime.launch(_setup_optimizers_first)
    with pytest.raises(RuntimeError, match=r"backward\(\) comes after Runtime.setup\(\)"):
        runtime.backward(torch.ones(1, requires_grad=True).sum())


def test_the_trainer_s_loops_reach_the_strategy_only_through_its_runtime():
    import ast
    import inspect

    import stratagem.trainer.accumulation as accumulation
    import stratagem.trainer.evaluation_loop as evaluation_loop
    import stratagem.trainer.fit_loop as fit_loop
    import stratagem.trainer.metrics as metrics
    import stratagem.trainer.predict_loop as predict_loop
    import stratagem.trainer.step_checks as step_checks
    from stratagem.trainer import manual_optimization

    trees: dict[str, ast.AST] = {
        module.__name__: ast.parse(Path(inspect.getfile(module)).read_text())
        for module in (accumulation, evaluation_loop, fit_loop, metrics, predict_loop, step_checks)
    }
    manual_tree = ast.parse(Path(inspect.getfile(manual_optimization)).read_text())
    # Which strategies can optimize manually is asked in the calling process; what a run calls is ManualSteps.
    trees["ManualSteps"] = next(
        node for node in ast.walk(manual_tree) if isinstance(node, ast.ClassDef) and node.name == "ManualSteps"
    )
    for name, tree in trees.items():
        named = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
        named |= {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
        assert not named & {"strategy", "Strategy"}, name


def test_the_trainer_drives_the_strategy_it_resolved_without_resolving_it_again(monkeypatch):
    import stratagem.trainer.trainer as trainer_module

    resolved = []
    real_resolve = trainer_module.resolve
    monkeypatch.setattr(trainer_module, "resolve", lambda **words: resolved.append(words) or real_resolve(**words))
    trainer = _trainer(max_steps=2, accumulate_grad_batches=2)
    trainer.fit(DemoModule(), DataLoader(make_classification(32), batch_size=8))
    assert len(resolved) == 1
    assert trainer.runtime.strategy is trainer.strategy
    assert trainer.runtime.loop_settings.accumulate_grad_batches == 2
    assert trainer.global_step == 2
