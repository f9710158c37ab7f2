import io

import pytest
from trainer_testing import ClassifierModule, make_loader, quiet_trainer

from stratagem.callbacks import ProgressBar


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def _fit_with(bar, **options):
    def run(root):
        trainer = quiet_trainer(root, enable_progress_bar=True, callbacks=[bar], **options)
        trainer.fit(ClassifierModule(), make_loader(num_samples=64, batch_size=8), make_loader(num_samples=16))
        return trainer

    return run


def test_without_a_terminal_it_prints_short_lines_with_loss_rate_and_eta(tmp_path):
    stream = io.StringIO()
    _fit_with(ProgressBar(print_seconds=1e-9, stream=stream), max_steps=12)(tmp_path)
    lines = stream.getvalue().splitlines()
    assert "\r" not in stream.getvalue()
    step_lines = [line for line in lines if line.startswith("epoch ")]
    assert step_lines[0].startswith("epoch 0 | step 1/12 | loss=")
    assert "train_loss=" in step_lines[0]
    assert "steps/s | ETA " in step_lines[0]
    assert any(line.startswith("validation (epoch 0, step 8): val_loss=") for line in lines)
    assert lines[-1].startswith("trained 12 steps in ")


def test_without_a_terminal_lines_come_at_the_interval_not_every_step(tmp_path):
    stream = io.StringIO()
    _fit_with(ProgressBar(print_seconds=3600, stream=stream), max_steps=12)(tmp_path)
    step_lines = [line for line in stream.getvalue().splitlines() if line.startswith("epoch ")]
    assert len(step_lines) == 1  # the final one, printed when training ends
    assert step_lines[0].startswith("epoch 1 | step 12/12")


@pytest.fixture
def wide_terminal(monkeypatch):
    # A StringIO has no file descriptor to ask for its size: COLUMNS says it instead.
    monkeypatch.setenv("COLUMNS", "100")


def test_on_a_terminal_it_draws_a_bar_with_metrics_and_rate(tmp_path, wide_terminal):
    stream = _Terminal()
    _fit_with(ProgressBar(refresh_seconds=1e-9, stream=stream), max_steps=12)(tmp_path)
    output = stream.getvalue()
    assert "\r" in output
    assert "12/12" in output
    assert "steps/s" in output
    assert "train_loss=" in output


def test_the_first_frame_on_a_terminal_names_the_epoch_and_has_no_empty_postfix(tmp_path, wide_terminal):
    stream = _Terminal()
    _fit_with(ProgressBar(refresh_seconds=3600, stream=stream), max_steps=4)(tmp_path)
    first_frame = stream.getvalue().split("\r")[1]
    assert first_frame.startswith("epoch 0 ")
    assert " , " not in stream.getvalue()
    assert "0/4 " not in first_frame.replace("0/4\x1b", "")
    assert first_frame.rstrip().endswith("0/4")


def test_a_terminal_that_reports_no_width_gets_lines_instead_of_no_progress(tmp_path, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    stream = _Terminal()
    _fit_with(ProgressBar(print_seconds=1e-9, stream=stream), max_steps=4)(tmp_path)
    output = stream.getvalue()
    assert "\r" not in output
    assert "epoch 0 | step 1/4 | loss=" in output
    assert output.splitlines()[-1].startswith("trained 4 steps in ")


def test_only_global_zero_shows_progress(tmp_path, monkeypatch):
    stream = io.StringIO()
    bar = ProgressBar(print_seconds=1e-9, stream=stream)
    trainer = quiet_trainer(tmp_path, enable_progress_bar=True, callbacks=[bar], max_steps=3)
    monkeypatch.setattr(type(trainer.strategy), "global_rank", property(lambda self: 1))
    trainer.fit(ClassifierModule(), make_loader())
    assert stream.getvalue() == ""


def test_test_results_are_printed(tmp_path):
    stream = io.StringIO()
    trainer = quiet_trainer(tmp_path, enable_progress_bar=True, callbacks=[ProgressBar(stream=stream)])
    trainer.test(ClassifierModule(), make_loader())
    assert stream.getvalue().startswith("test: test_loss=")


def test_intervals_must_be_positive():
    with pytest.raises(ValueError, match="positive"):
        ProgressBar(refresh_seconds=0)
