"""A strategy whose engine owns the whole training step: the Trainer only hands it data and counts steps."""

from typing import Any

import torch
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader
from trainer_testing import ClassifierModule, make_loader, quiet_trainer

from stratagem.runtime import Runtime
from stratagem.strategies import EngineSteps, OwnsTrainingStep, RebuildsDataLoaders, SingleDeviceStrategy
from stratagem.trainer.accumulation import EngineTrainingSteps, accumulation_policy

MICRO_BATCHES_PER_CALL = 2


class _WholeStepEngine(SingleDeviceStrategy, OwnsTrainingStep, RebuildsDataLoaders):
    """Each call trains two micro-batches, stepping its optimizer after each (two steps per call)."""

    def __init__(self) -> None:
        super().__init__()
        self.rebuilt: list[str] = []
        self.trainer_calls: list[str] = []
        self.calls = 0

    @property
    def optimizer_steps_per_call(self) -> int:
        return MICRO_BATCHES_PER_CALL

    def rebuild_dataloader(self, loader: Any, stage: str) -> DataLoader:
        self.rebuilt.append(stage)
        return DataLoader(loader.dataset, batch_size=loader.batch_size * MICRO_BATCHES_PER_CALL)

    def setup_optimizers(self, optimizers: list[torch.optim.Optimizer]) -> list[torch.optim.Optimizer]:
        self.engine_optimizer = optimizers[0]
        return super().setup_optimizers(optimizers)

    def run_training_steps(self, batch: Any, batch_idx: int) -> EngineSteps:
        self.calls += 1
        losses = []
        for micro_batch in zip(*(part.chunk(MICRO_BATCHES_PER_CALL) for part in batch)):
            self.engine_optimizer.zero_grad()
            loss = self.run_step("training_step", list(micro_batch), batch_idx)
            loss.backward()
            self.engine_optimizer.step()
            losses.append(loss.detach())
        return EngineSteps(output=torch.stack(losses).mean(), optimizer_steps=MICRO_BATCHES_PER_CALL)

    def backward(self, loss: torch.Tensor, optimizer: Any) -> None:
        self.trainer_calls.append("backward")

    def optimizer_step(self, optimizer: Any) -> Any:
        self.trainer_calls.append("optimizer_step")

    def zero_grad(self, optimizer: Any) -> None:
        self.trainer_calls.append("zero_grad")

    def clip_gradients(self, optimizer: Any, clip_val: float, algorithm: Any = "norm") -> None:
        self.trainer_calls.append("clip_gradients")


def test_an_engine_that_owns_the_step_gets_the_engine_policy_whatever_else_it_could_do():
    strategy = _WholeStepEngine()
    policy = accumulation_policy(Runtime.around(strategy), 4, [], strategy.optimizer_step)
    assert isinstance(policy, EngineTrainingSteps)
    assert policy.optimizer_steps(num_batches=3) == 3 * MICRO_BATCHES_PER_CALL


def test_the_trainer_counts_the_engine_s_steps_and_never_runs_backward_or_steps_itself(tmp_path):
    strategy = _WholeStepEngine()
    module = ClassifierModule(
        scheduler=lambda optimizer: {"scheduler": StepLR(optimizer, 1, gamma=0.5), "interval": "step"}
    )
    trainer = quiet_trainer(tmp_path, strategy=strategy, max_epochs=2, accumulate_grad_batches=2)
    trainer.fit(module, make_loader(64, batch_size=8), make_loader(32, batch_size=8))
    assert strategy.calls == 2 * 64 // (8 * MICRO_BATCHES_PER_CALL)
    assert trainer.global_step == strategy.calls * MICRO_BATCHES_PER_CALL
    assert trainer.estimated_total_steps == trainer.global_step
    assert strategy.trainer_calls == []
    assert torch.isfinite(trainer.callback_metrics["train_loss"])
    assert module.lr_schedulers().last_epoch == trainer.global_step


def test_every_pass_s_loaders_are_rebuilt_once_with_the_pass_s_stage(tmp_path):
    strategy = _WholeStepEngine()
    trainer = quiet_trainer(tmp_path, strategy=strategy, max_epochs=2)
    module = ClassifierModule()
    trainer.fit(module, make_loader(32), make_loader(16))
    trainer.validate(module, make_loader(16))
    trainer.test(module, make_loader(16))
    trainer.predict(module, make_loader(16))
    assert strategy.rebuilt == ["fit", "validate", "validate", "test", "predict"]
