import csv

import pytest
import torch
from torch.nn import functional
from torch.utils.data import DataLoader, TensorDataset
from trainer_testing import ClassifierModule, make_loader, quiet_trainer

import stratagem
from stratagem.callbacks import Callback


class _Constant(stratagem.Module):
    """Logs what the batch holds, so that aggregates can be checked exactly."""

    def validation_step(self, batch, batch_idx, *args):
        (values,) = batch
        self.log("mean", values.float().mean())
        self.log("total", values.float().sum(), reduce_fx="sum")
        self.log("largest", values.float().max(), reduce_fx="max")
        self.log("smallest", values.float().min(), reduce_fx=torch.min)

    def test_step(self, batch, batch_idx, *args):
        self.validation_step(batch, batch_idx)


def _values_loader(values, batch_size):
    return DataLoader(TensorDataset(torch.tensor(values)), batch_size=batch_size)


def test_validate_aggregates_over_the_epoch_weighting_the_mean_by_batch_size(tmp_path):
    # Batches [1, 2, 3] and [10]: the mean over samples is 4, the mean of batch means would be 6.
    results = quiet_trainer(tmp_path).validate(_Constant(), _values_loader([1, 2, 3, 10], batch_size=3))
    assert results == [{"mean": 4.0, "total": 16.0, "largest": 10.0, "smallest": 1.0}]


def test_several_dataloaders_give_one_result_each_with_suffixed_names(tmp_path):
    class Shared(_Constant):
        def on_test_epoch_end(self):
            self.log("shared", 1.0)

    trainer = quiet_trainer(tmp_path)
    results = trainer.test(Shared(), [_values_loader([1, 3], 2), _values_loader([5], 1)])
    assert results == [
        {
            "mean/dataloader_idx_0": 2.0,
            "total/dataloader_idx_0": 4.0,
            "largest/dataloader_idx_0": 3.0,
            "smallest/dataloader_idx_0": 1.0,
            "shared": 1.0,
        },
        {
            "mean/dataloader_idx_1": 5.0,
            "total/dataloader_idx_1": 5.0,
            "largest/dataloader_idx_1": 5.0,
            "smallest/dataloader_idx_1": 5.0,
            "shared": 1.0,
        },
    ]
    assert float(trainer.callback_metrics["mean/dataloader_idx_1"]) == 5.0


def test_limit_val_batches_bounds_validate(tmp_path):
    results = quiet_trainer(tmp_path, limit_val_batches=1).validate(_Constant(), _values_loader([1, 2, 30], 2))
    assert results[0]["largest"] == 2.0


def test_validation_leaves_the_module_in_training_mode_and_the_random_stream_untouched(tmp_path):
    module = ClassifierModule(dropout=0.5)
    trainer = quiet_trainer(tmp_path)
    torch.manual_seed(3)
    expected = torch.rand(3)
    torch.manual_seed(3)
    trainer.validate(module, make_loader(shuffle=True))
    assert torch.equal(torch.rand(3), expected)
    assert module.training


def test_step_values_and_epoch_values_of_one_metric_get_their_own_names(tmp_path):
    class Both(ClassifierModule):
        def training_step(self, batch, batch_idx):
            loss = functional.cross_entropy(self(batch[0]), batch[1])
            self.log("loss", loss, on_step=True, on_epoch=True, prog_bar=True)
            self.log("batch_idx", batch_idx, reduce_fx="max", on_epoch=True, on_step=False)
            return loss

    trainer = quiet_trainer(tmp_path, max_epochs=1)
    trainer.fit(Both(), make_loader(num_samples=32, batch_size=8))
    assert {"loss_step", "loss_epoch", "batch_idx"} <= set(trainer.callback_metrics)
    assert float(trainer.callback_metrics["batch_idx"]) == 3.0
    assert set(trainer.progress_bar_metrics) == {"loss", "loss_step", "loss_epoch"}


def test_values_logged_at_the_end_of_a_training_epoch_count_at_once_for_callbacks_and_loggers(tmp_path):
    seen = []

    class EpochEnd(ClassifierModule):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            self.log("mean_loss", loss, on_step=False, on_epoch=True)
            return loss

        def on_train_epoch_end(self):
            seen.append(float(self.trainer.callback_metrics["mean_loss"]))
            self.log("epoch_number", float(self.trainer.current_epoch))

    class Reader(Callback):
        def on_train_epoch_end(self, trainer, module):
            self_logged = float(trainer.callback_metrics["epoch_number"])
            seen.append(self_logged)
            module.log("from_callback", self_logged + 10)

    trainer = quiet_trainer(tmp_path, max_epochs=2, logger="csv", callbacks=[Reader()])
    trainer.fit(EpochEnd(), make_loader(num_samples=16))
    assert seen[1::2] == [0.0, 1.0]
    assert float(trainer.callback_metrics["from_callback"]) == 11.0
    with open(trainer.logger.metrics_file) as stream:
        rows = list(csv.DictReader(stream))
    assert [(row["epoch_number"], row["from_callback"]) for row in rows if row["epoch_number"]] == [
        ("0.0", "10.0"),
        ("1.0", "11.0"),
    ]


def test_predict_returns_each_batchs_output_in_order(tmp_path):
    module = ClassifierModule()
    loader = make_loader(num_samples=20, batch_size=8)
    predictions = quiet_trainer(tmp_path).predict(module, loader)
    assert [len(batch) for batch in predictions] == [8, 8, 4]
    expected = module(loader.dataset.tensors[0]).argmax(1)
    assert torch.equal(torch.cat(predictions), expected)
    several = quiet_trainer(tmp_path, limit_predict_batches=1).predict(module, [loader, loader])
    assert [len(outputs) for outputs in several] == [1, 1]


def test_logging_in_predict_or_outside_a_run_is_refused_or_dropped(tmp_path):
    class LogsInPredict(ClassifierModule):
        def predict_step(self, batch, batch_idx, *args):
            self.log("x", 1.0)

    with pytest.raises(RuntimeError, match=r"self.log\('x'\) is not supported here"):
        quiet_trainer(tmp_path).predict(LogsInPredict(), make_loader())
    with pytest.warns(UserWarning, match="outside a Trainer run; the value is dropped"):
        ClassifierModule().log("x", 1.0)


@pytest.mark.parametrize(
    ("value", "options", "error", "message"),
    [
        (torch.ones(2), {}, ValueError, r"needs a scalar; got a tensor of shape \(2,\)"),
        ("high", {}, TypeError, "needs a number or a scalar tensor; got str"),
        (1.0, {"reduce_fx": "median"}, ValueError, r"reduce_fx='median'\) is not valid"),
    ],
)
def test_bad_log_calls_name_the_metric_and_what_is_accepted(tmp_path, value, options, error, message):
    class BadLog(ClassifierModule):
        def validation_step(self, batch, batch_idx, *args):
            self.log("metric", value, **options)

    with pytest.raises(error, match=message):
        quiet_trainer(tmp_path).validate(BadLog(), make_loader())


def test_validate_and_test_load_weights_from_a_checkpoint(tmp_path):
    trained = ClassifierModule()
    trainer = quiet_trainer(tmp_path, max_epochs=3)
    trainer.fit(trained, make_loader())
    trainer.save_checkpoint(tmp_path / "trained.ckpt")
    expected = trainer.validate(trained, make_loader())
    fresh = ClassifierModule()
    assert quiet_trainer(tmp_path).validate(fresh, make_loader(), ckpt_path=tmp_path / "trained.ckpt") == expected
    assert torch.equal(fresh.layers[0].weight, trained.layers[0].weight)


@pytest.mark.parametrize("stage", ["validate", "test"])
def test_save_checkpoint_after_validate_or_test_writes_weights_that_evaluate_the_same(tmp_path, stage):
    trainer = quiet_trainer(tmp_path)
    module = ClassifierModule()
    expected = getattr(trainer, stage)(module, make_loader())
    trainer.save_checkpoint(tmp_path / "evaluated.ckpt")
    fresh = ClassifierModule()
    with torch.no_grad():
        fresh.layers[0].weight.add_(1.0)
    loaded = getattr(quiet_trainer(tmp_path), stage)(fresh, make_loader(), ckpt_path=tmp_path / "evaluated.ckpt")
    assert loaded == expected
    assert torch.equal(fresh.layers[0].weight, module.layers[0].weight)
