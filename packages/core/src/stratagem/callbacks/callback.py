"""The Callback interface: code that runs at points of a Trainer's loops, outside the Module."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import torch

    from stratagem.module import Module
    from stratagem.trainer.trainer import Trainer

RunStage = Literal["fit", "validate", "test", "predict"]


class Callback:
    """Override the hooks you need; every hook does nothing by default.

    Callbacks run in every worker process. Work that must happen once (printing, writing a
    file) checks ``trainer.is_global_zero``; work that involves collectives (saving a sharded
    checkpoint) runs on every rank. A callback's :meth:`state_dict` is saved in checkpoints
    under :attr:`state_key` and travels back to the calling process after a spawned run.
    """

    @property
    def state_key(self) -> str:
        """Identifies this callback's state in a checkpoint; make it unique among your callbacks."""
        return type(self).__qualname__

    def setup(self, trainer: Trainer, module: Module, stage: RunStage) -> None:
        """Called in every worker at the start of fit/validate/test/predict, before any data is read."""

    def teardown(self, trainer: Trainer, module: Module, stage: RunStage) -> None:
        """Called at the end of fit/validate/test/predict, also after an error."""

    def on_exception(self, trainer: Trainer, module: Module, exception: BaseException) -> None:
        """Called when the run raises, before teardown."""

    def on_fit_start(self, trainer: Trainer, module: Module) -> None:
        """Called after setup and checkpoint restore."""

    def on_fit_end(self, trainer: Trainer, module: Module) -> None:
        """Called when fitting ended without an error."""

    def on_train_start(self, trainer: Trainer, module: Module) -> None:
        """Called before the first training batch, after the sanity check."""

    def on_train_end(self, trainer: Trainer, module: Module) -> None:
        """Called after the last training batch."""

    def on_train_epoch_start(self, trainer: Trainer, module: Module) -> None:
        """Called at the start of every training epoch."""

    def on_train_epoch_end(self, trainer: Trainer, module: Module) -> None:
        """Called after every completed epoch, its validation and the module's epoch-end hook."""

    def on_train_batch_start(self, trainer: Trainer, module: Module, batch: Any, batch_idx: int) -> None:
        """Called before every training step."""

    def on_train_batch_end(self, trainer: Trainer, module: Module, outputs: Any, batch: Any, batch_idx: int) -> None:
        """Called after every training step; ``trainer.global_step`` already counts its optimizer step."""

    def on_before_backward(self, trainer: Trainer, module: Module, loss: torch.Tensor) -> None:
        """Called before every training backward, with the loss it runs on (divided by
        ``accumulate_grad_batches``, not yet scaled by a mixed-precision loss scaler); before the module's hook."""

    def on_after_backward(self, trainer: Trainer, module: Module) -> None:
        """Called after every training backward, with the gradients computed (and, under ddp, synchronised on
        the last micro-batch of a window); before the module's hook."""

    def on_before_optimizer_step(self, trainer: Trainer, module: Module, optimizer: torch.optim.Optimizer) -> None:
        """Called before each optimizer step, before gradient clipping; before the module's hook. Not called
        where the strategy's engine runs whole training steps (an ``OwnsTrainingStep`` strategy)."""

    def on_validation_start(self, trainer: Trainer, module: Module) -> None:
        """Called before a validation pass (also the sanity check: see ``trainer.sanity_checking``)."""

    def on_validation_end(self, trainer: Trainer, module: Module) -> None:
        """Called after a validation pass, when its metrics are in ``trainer.callback_metrics``."""

    def on_validation_batch_end(
        self, trainer: Trainer, module: Module, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int
    ) -> None:
        """Called after every validation step."""

    def on_test_start(self, trainer: Trainer, module: Module) -> None:
        """Called before the test pass."""

    def on_test_end(self, trainer: Trainer, module: Module) -> None:
        """Called after the test pass."""

    def on_test_batch_end(
        self, trainer: Trainer, module: Module, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int
    ) -> None:
        """Called after every test step."""

    def on_predict_start(self, trainer: Trainer, module: Module) -> None:
        """Called before the prediction pass."""

    def on_predict_end(self, trainer: Trainer, module: Module) -> None:
        """Called after the prediction pass."""

    def on_predict_batch_end(
        self, trainer: Trainer, module: Module, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int
    ) -> None:
        """Called after every prediction step."""

    def on_save_checkpoint(self, trainer: Trainer, module: Module, checkpoint: dict[str, Any]) -> None:
        """Add entries to a checkpoint about to be saved (own state belongs in :meth:`state_dict`)."""

    def on_load_checkpoint(self, trainer: Trainer, module: Module, checkpoint: dict[str, Any]) -> None:
        """Read entries from a loaded checkpoint (called after :meth:`load_state_dict`)."""

    def state_dict(self) -> dict[str, Any]:
        """State to keep in checkpoints: plain values only (numbers, strings, tensors, lists, dicts)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
