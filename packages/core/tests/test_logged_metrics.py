"""LoggedMetrics: a step value logged again under the same options takes a short path with the same result."""

from typing import Any

import pytest
import torch

from stratagem.runtime import Runtime
from stratagem.strategies import SingleDeviceStrategy
from stratagem.trainer.metrics import LoggedMetrics

_DEFAULTS: dict[str, Any] = {
    "prog_bar": False,
    "logger": True,
    "on_step": None,
    "on_epoch": None,
    "sync_dist": False,
    "reduce_fx": "mean",
    "batch_size": None,
}


def _metrics(stage: Any = "train_step") -> LoggedMetrics:
    metrics = LoggedMetrics()
    metrics.runtime = Runtime.around(SingleDeviceStrategy())
    metrics.stage = stage
    metrics.batch = (torch.zeros(4, 2),)
    return metrics


def _log(metrics: LoggedMetrics, name: str, value: Any, **options: Any) -> None:
    metrics.log(name, value, **{**_DEFAULTS, **options})


def test_a_step_value_logged_on_every_step_holds_the_latest_value_without_its_graph():
    metrics = _metrics()
    weight = torch.tensor(1.0, requires_grad=True)
    for step in range(3):
        _log(metrics, "loss", weight * step, prog_bar=True)
    assert metrics.callback_metrics["loss"].item() == 2.0
    assert not metrics.callback_metrics["loss"].requires_grad
    assert metrics.step_metrics_for_logger() == {"loss": 2.0}
    assert metrics.progress_bar_metrics() == {"loss": 2.0}


def test_the_same_name_logged_with_other_options_is_recorded_as_those_options_say():
    metrics = _metrics()
    _log(metrics, "x", torch.tensor(1.0))
    _log(metrics, "x", torch.tensor(3.0), on_epoch=True)
    _log(metrics, "x", torch.tensor(5.0), on_epoch=True)
    _log(metrics, "x", torch.tensor(7.0), logger=False)
    assert metrics.callback_metrics["x"].item() == 7.0
    assert metrics.callback_metrics["x_step"].item() == 5.0
    assert metrics.finish_epoch("train") == {"x_epoch": 4.0}


def test_a_bad_value_is_refused_under_a_name_already_logged_with_the_same_options():
    metrics = _metrics()
    _log(metrics, "loss", torch.tensor(1.0))
    with pytest.raises(ValueError, match=r"self.log\('loss'\) needs a scalar; got a tensor of shape \(2,\)"):
        _log(metrics, "loss", torch.ones(2))
    with pytest.raises(TypeError, match=r"self.log\('loss'\) needs a number or a scalar tensor; got str"):
        _log(metrics, "loss", "high")
    assert metrics.callback_metrics["loss"].item() == 1.0


def test_a_name_logged_in_training_steps_is_aggregated_when_evaluation_logs_it():
    metrics = _metrics()
    _log(metrics, "score", torch.tensor(1.0))
    metrics.stage = "evaluation"
    metrics.suffix = "/dataloader_idx_1"
    _log(metrics, "score", torch.tensor(2.0))
    _log(metrics, "score", torch.tensor(4.0))
    assert metrics.finish_epoch("evaluation") == {"score/dataloader_idx_1": 3.0}
    assert metrics.callback_metrics["score"].item() == 1.0
