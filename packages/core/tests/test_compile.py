"""torch.compile in a run on one process: compiled modules accepted by every entry point, ``Trainer(compile=)``
checked before anything runs, and checkpoints whose keys are those of the uncompiled module."""

from __future__ import annotations

import pickle
import time
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from stratagem import Module, Trainer
from stratagem.strategies.compilation import compile_submodules_in_place, strip_compile_prefix

FEATURES = 8
STEPS = 4


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(FEATURES, FEATURES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.linear(x))


class Net(Module):
    def __init__(self, compile_blocks_with: str | None = None) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.blocks = nn.Sequential(Block(), Block())
        self.head = nn.Linear(FEATURES, 1)
        self.compile_blocks_with = compile_blocks_with
        self.steps_seen = 0
        self.forward_hook_calls = 0
        self.register_forward_hook(self._count_forward)

    def _count_forward(self, module: nn.Module, args: Any, output: Any) -> None:
        self.forward_hook_calls += 1

    def configure_model(self) -> None:
        if self.compile_blocks_with is not None:
            self.blocks = torch.compile(self.blocks, backend=self.compile_blocks_with)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(x))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.steps_seen += 1
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y))

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self.validation_step(batch, batch_idx)

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self(batch[0])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def data() -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(STEPS * 4, FEATURES, generator=generator)
    return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True).sin()), batch_size=4)


def make_trainer(tmp_path: Any, **options: Any) -> Trainer:
    return Trainer(
        accelerator="cpu",
        max_steps=STEPS,
        num_sanity_val_steps=0,
        logger=False,
        enable_progress_bar=False,
        default_root_dir=tmp_path,
        seed=0,
        **options,
    )


def fresh(compile_blocks_with: str | None = None) -> Net:
    torch.manual_seed(0)
    return Net(compile_blocks_with)


@pytest.fixture(scope="module")
def eager_run(tmp_path_factory) -> tuple[float, dict[str, torch.Tensor], int]:
    """The uncompiled fit: its last loss, its weights, and how often the user's forward hook ran."""
    module = fresh()
    trainer = make_trainer(tmp_path_factory.mktemp("eager"), enable_checkpointing=False)
    trainer.fit(module, data())
    return float(trainer.callback_metrics["train_loss"]), module.state_dict(), module.forward_hook_calls


def assert_same_weights(weights: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], atol: float = 0) -> None:
    assert set(weights) == set(expected)
    for name, value in expected.items():
        torch.testing.assert_close(weights[name], value, atol=atol, rtol=0, msg=name)


def test_every_entry_point_takes_a_compiled_module_and_runs_the_users_own_module(tmp_path, eager_run):
    module = fresh()
    compiled = torch.compile(module, backend="eager")
    trainer = make_trainer(tmp_path, enable_checkpointing=False)
    trainer.fit(compiled, data())
    assert float(trainer.callback_metrics["train_loss"]) == pytest.approx(eager_run[0], rel=1e-6)
    assert module.steps_seen == STEPS
    assert module.forward_hook_calls == eager_run[2]
    [validated] = trainer.validate(compiled, data())
    [tested] = trainer.test(compiled, data())
    assert validated["val_loss"] == tested["val_loss"]
    predictions = trainer.predict(compiled, data())
    assert len(predictions) == STEPS
    # What the run compiled is gone with it: the module is the one given, and pickles.
    assert "forward" not in module.__dict__
    pickle.dumps(module)


def test_compile_blocks_compiles_each_block_and_trains_like_eager(tmp_path, eager_run):
    module = fresh()
    torch._dynamo.reset()
    trainer = make_trainer(tmp_path, enable_checkpointing=False, compile={"backend": "eager", "blocks": {Block}})
    trainer.fit(module, data())
    assert float(trainer.callback_metrics["train_loss"]) == pytest.approx(eager_run[0], rel=1e-6)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1
    assert all("forward" not in block.__dict__ for block in module.blocks)


def test_inductor_compiles_the_blocks_on_the_cpu_with_the_eager_result(tmp_path, eager_run):
    module = fresh()
    trainer = make_trainer(tmp_path, enable_checkpointing=False, compile={"blocks": Block})
    started = time.perf_counter()
    trainer.fit(module, data())
    print(f"inductor fit of {STEPS} steps: {time.perf_counter() - started:.1f} s")
    assert float(trainer.callback_metrics["train_loss"]) == pytest.approx(eager_run[0], rel=1e-4)
    assert_same_weights(module.state_dict(), eager_run[1], atol=1e-5)


def test_a_module_compiling_its_blocks_saves_the_uncompiled_keys_and_loads_both_ways(tmp_path, eager_run):
    module = fresh("eager")
    trainer = make_trainer(tmp_path)
    trainer.fit(module, data())
    [checkpoint] = (tmp_path / "checkpoints").rglob("*.ckpt")
    saved = torch.load(checkpoint, weights_only=True)["module"]
    assert set(saved) == set(eager_run[1])
    assert_same_weights(saved, eager_run[1], atol=1e-6)
    uncompiled = Net.load_from_checkpoint(checkpoint)
    recompiled = Net.load_from_checkpoint(checkpoint, compile_blocks_with="eager")
    assert_same_weights(uncompiled.state_dict(), saved)
    assert_same_weights(recompiled.state_dict(), saved)
    [metrics] = make_trainer(tmp_path).validate(fresh("eager"), data(), ckpt_path=checkpoint)
    [expected] = make_trainer(tmp_path).validate(fresh(), data(), ckpt_path=checkpoint)
    assert metrics["val_loss"] == pytest.approx(expected["val_loss"], rel=1e-6)


def test_a_checkpoint_saved_with_orig_mod_keys_loads_into_an_uncompiled_module(tmp_path, eager_run):
    compiled = fresh()
    compiled.blocks = torch.compile(compiled.blocks, backend="eager")
    weights = compiled.state_dict()
    assert any("_orig_mod" in key for key in weights)
    assert set(strip_compile_prefix(weights)) == set(eager_run[1])
    module = fresh()
    compile_submodules_in_place(compiled)
    assert set(compiled.state_dict()) == set(module.state_dict())
    trainer = make_trainer(tmp_path, enable_checkpointing=False)
    path = tmp_path / "legacy.ckpt"
    torch.save({"module": weights, "state_dict": weights}, path)
    trainer.validate(module, data(), ckpt_path=path)


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        ("yes", TypeError, "compile='yes' is not valid"),
        ({"backend": "eager", "fullgraf": True}, ValueError, "['fullgraf'] are not options"),
        ({"blocks": "Block"}, TypeError, "an nn.Module subclass or a non-empty set"),
        ({"blocks": {int}}, TypeError, "an nn.Module subclass or a non-empty set"),
    ],
)
def test_a_compile_option_that_cannot_work_is_refused_when_the_trainer_is_made(value, error, message):
    with pytest.raises(error, match=message.replace("[", r"\[").replace("]", r"\]")):
        Trainer(accelerator="cpu", compile=value)


def test_a_compiled_module_given_to_a_trainer_that_compiles_is_refused_before_running(tmp_path):
    module = fresh()
    trainer = make_trainer(tmp_path, compile=True)
    with pytest.raises(ValueError, match=r"say once how to compile"):
        trainer.fit(torch.compile(module, backend="eager"), data())
    assert module.steps_seen == 0


def test_blocks_the_model_does_not_have_are_refused_before_the_first_step(tmp_path):
    module = fresh()
    trainer = make_trainer(tmp_path, compile={"backend": "eager", "blocks": nn.LSTM})
    with pytest.raises(ValueError, match=r"names the blocks LSTM, but Net has no submodule of those classes"):
        trainer.fit(module, data())
    assert module.steps_seen == 0


def test_weights_a_spawned_run_sends_back_load_into_a_caller_module_that_compiles_its_blocks(tmp_path):
    from stratagem.trainer.worker_output import WorkerOutput

    worker_module = fresh("eager")
    worker_module.configure_model()
    compile_submodules_in_place(worker_module)
    caller_module = fresh("eager")
    trainer = make_trainer(tmp_path)
    sent = WorkerOutput(module_state=worker_module.state_dict(), fit_progress=trainer.fit_progress.state_dict())
    sent.apply(trainer, trainer._context, caller_module)
    assert_same_weights(caller_module.state_dict(), worker_module.state_dict())
