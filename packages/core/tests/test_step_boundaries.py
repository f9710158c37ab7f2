"""StepBoundaryListener: a strategy told after backward, after each optimizer step and before evaluation steps."""

import ast
import inspect
from pathlib import Path

from trainer_testing import ClassifierModule, make_loader, quiet_trainer

import stratagem.trainer.evaluation_loop as evaluation_loop_module
import stratagem.trainer.fit_loop as fit_loop_module
import stratagem.trainer.predict_loop as predict_loop_module
from stratagem.runtime import Runtime
from stratagem.strategies import SingleDeviceStrategy, StepBoundary, StepBoundaryListener, Strategy


class _Listening(SingleDeviceStrategy, StepBoundaryListener):
    def __init__(self) -> None:
        super().__init__()
        self.boundaries: list[StepBoundary] = []

    def at_step_boundary(self, boundary: StepBoundary) -> None:
        self.boundaries.append(boundary)


def test_a_fit_tells_the_strategy_after_every_backward_and_after_every_optimizer_step(tmp_path):
    strategy = _Listening()
    trainer = quiet_trainer(tmp_path, strategy=strategy, max_epochs=1, accumulate_grad_batches=2)
    # Four batches, two windows of two: the metric logged in every training_step is no boundary.
    trainer.fit(ClassifierModule(), make_loader(num_samples=32, batch_size=8))
    assert strategy.boundaries == 2 * ["after_backward", "after_backward", "after_optimizer_step"]


def test_validate_test_and_predict_tell_the_strategy_before_every_step(tmp_path):
    strategy = _Listening()
    trainer = quiet_trainer(tmp_path, strategy=strategy)
    module = ClassifierModule()
    loader = make_loader(num_samples=24, batch_size=8)
    trainer.validate(module, loader)
    trainer.test(module, loader)
    trainer.predict(module, loader)
    assert strategy.boundaries == 9 * ["before_evaluation_step"]


def test_a_strategy_without_the_ability_gets_no_callback_so_the_loops_call_nothing():
    strategy = SingleDeviceStrategy()
    assert not hasattr(Strategy, "at_step_boundary")
    assert Runtime.around(strategy).step_boundary is None


def test_the_loops_never_refer_to_the_ability_itself():
    for module in (fit_loop_module, evaluation_loop_module, predict_loop_module):
        source = Path(inspect.getfile(module)).read_text()
        names = {node.id for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Name)}
        assert "StepBoundaryListener" not in names, module.__name__
