import math

import pytest
from trainer_testing import ClassifierModule, make_loader, quiet_trainer

from stratagem.callbacks import EarlyStopping


class _Scripted(ClassifierModule):
    def __init__(self, scores):
        super().__init__()
        self.scores = list(scores)

    def validation_step(self, batch, batch_idx, *args):
        pass

    def on_validation_epoch_end(self):
        if not self.trainer.sanity_checking:
            self.log("score", self.scores.pop(0))


def _stopped_after(scores, **options):
    def run(root):
        stopper = EarlyStopping("score", **options)
        trainer = quiet_trainer(root, max_epochs=len(scores), callbacks=[stopper], num_sanity_val_steps=1)
        trainer.fit(_Scripted(scores), make_loader(num_samples=16), make_loader(num_samples=8))
        return trainer.current_epoch, stopper

    return run


def test_stops_when_the_metric_has_not_improved_for_patience_validations(tmp_path):
    epochs, stopper = _stopped_after([1.0, 0.9, 0.95, 0.91, 0.92, 0.5], patience=3)(tmp_path)
    assert epochs == 5
    assert stopper.stopped_epoch == 4
    assert "did not improve for 3 validations" in stopper.stopping_reason


def test_min_delta_and_mode_decide_what_counts_as_improvement(tmp_path):
    epochs, _ = _stopped_after([0.1, 0.15, 0.16, 0.3], patience=1, mode="max", min_delta=0.02)(tmp_path)
    assert epochs == 3


def test_thresholds_and_non_finite_values_stop_at_once(tmp_path):
    epochs, stopper = _stopped_after([1.0, 0.05, 0.01], stopping_threshold=0.1)(tmp_path / "a")
    assert (epochs, "reached stopping_threshold" in stopper.stopping_reason) == (2, True)
    epochs, stopper = _stopped_after([1.0, 7.0, 0.5], divergence_threshold=5.0)(tmp_path / "b")
    assert (epochs, "divergence_threshold" in stopper.stopping_reason) == (2, True)
    epochs, stopper = _stopped_after([1.0, math.nan, 0.5])(tmp_path / "c")
    assert (epochs, "is not finite" in stopper.stopping_reason) == (2, True)


def test_a_metric_that_is_never_logged_is_an_error_unless_not_strict(tmp_path):
    def run(root, strict):
        trainer = quiet_trainer(root, max_epochs=2, callbacks=[EarlyStopping("nothing", strict=strict)])
        trainer.fit(ClassifierModule(), make_loader(num_samples=16), make_loader(num_samples=8))
        return trainer

    with pytest.raises(RuntimeError, match="EarlyStopping\\(monitor='nothing'\\) found no such metric"):
        run(tmp_path, strict=True)
    assert run(tmp_path, strict=False).current_epoch == 2


def test_its_state_survives_a_checkpoint(tmp_path):
    stopper = EarlyStopping("score", patience=5)
    stopper.wait_count, stopper.best_score = 2, 0.25
    restored = EarlyStopping("score", patience=5)
    restored.load_state_dict(stopper.state_dict())
    assert (restored.wait_count, restored.best_score) == (2, 0.25)


def test_settings_that_cannot_work_are_refused():
    with pytest.raises(ValueError, match="mode='lowest'"):
        EarlyStopping("x", mode="lowest")
    with pytest.raises(ValueError, match="patience=-1"):
        EarlyStopping("x", patience=-1)
    with pytest.raises(ValueError, match=r"min_delta=-0\.1"):
        EarlyStopping("x", min_delta=-0.1)


def test_a_nan_let_through_by_check_finite_false_counts_as_the_worst_value(tmp_path):
    epochs, stopper = _stopped_after([math.nan, 0.9, 0.8, 0.05], check_finite=False, stopping_threshold=0.1)(tmp_path)
    assert epochs == 4
    assert "score = 0.05 reached stopping_threshold" in stopper.stopping_reason
    assert stopper.best_score == pytest.approx(0.05)
