import csv
import pickle
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from trainer_testing import ClassifierModule, make_loader, quiet_trainer

from stratagem.loggers import CSVLogger, TensorBoardLogger
from stratagem.loggers import tensorboard as tensorboard_module
from stratagem.loggers.logger import claim_next_version


def _rows(path):
    with open(path, newline="") as stream:
        return list(csv.DictReader(stream))


def test_csv_logger_writes_step_metrics_every_n_steps_and_epoch_metrics(tmp_path):
    trainer = quiet_trainer(tmp_path, max_epochs=2, logger=True, log_every_n_steps=2)
    trainer.fit(ClassifierModule(), make_loader(num_samples=32, batch_size=8), make_loader(num_samples=8))
    logger = trainer.logger
    assert isinstance(logger, CSVLogger)
    rows = _rows(logger.metrics_file)
    assert logger.metrics_file == tmp_path / "csv_logs" / "version_0" / "metrics.csv"
    assert [row["step"] for row in rows if row["train_loss"]] == ["2", "4", "6", "8"]
    assert [(row["step"], row["epoch"]) for row in rows if row["val_loss"]] == [("4", "0"), ("8", "1")]
    assert set(rows[0]) == {"step", "train_loss", "epoch", "val_loss", "val_acc"}


def test_csv_logger_rewrites_its_header_when_a_new_metric_appears(tmp_path):
    logger = CSVLogger(tmp_path, flush_every_n_rows=1)
    logger.log_metrics({"a": 1.0}, step=0)
    logger.log_metrics({"b": 2.0}, step=1)
    logger.log_metrics({"a": 3.0}, step=2)
    logger.finalize("success")
    assert _rows(logger.metrics_file) == [
        {"step": "0", "a": "1.0", "b": ""},
        {"step": "1", "a": "", "b": "2.0"},
        {"step": "2", "a": "3.0", "b": ""},
    ]


def test_a_logger_continuing_a_version_keeps_the_columns_already_written(tmp_path):
    first = CSVLogger(tmp_path)
    first.log_metrics({"train_loss": 1.0}, step=1)
    first.finalize("success")
    second = CSVLogger(tmp_path, version=first.version)
    second.log_metrics({"val_loss": 2.0}, step=2)
    second.finalize("success")
    assert _rows(first.metrics_file) == [
        {"step": "1", "train_loss": "1.0", "val_loss": ""},
        {"step": "2", "train_loss": "", "val_loss": "2.0"},
    ]


def test_each_new_logger_takes_the_next_version_directory(tmp_path):
    first, second = CSVLogger(tmp_path), CSVLogger(tmp_path)
    first.log_metrics({"a": 1.0}, step=0)
    first.save()
    assert (first.version, second.version) == (0, 1)
    assert CSVLogger(tmp_path, version="named").log_dir == str(tmp_path / "csv_logs" / "named")


def test_loggers_write_on_global_zero_only(tmp_path, monkeypatch):
    trainer = quiet_trainer(tmp_path, max_steps=4, logger="csv", log_every_n_steps=1)
    monkeypatch.setattr(type(trainer.strategy), "global_rank", property(lambda self: 1))
    trainer.fit(ClassifierModule(), make_loader())
    assert not (tmp_path / "csv_logs").exists()


def test_tensorboard_that_is_not_installed_is_refused_with_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setattr(tensorboard_module, "tensorboard_available", lambda: False)
    with pytest.raises(ValueError, match=r'needs the tensorboard package.*pip install "stratagem\[tensorboard\]"'):
        quiet_trainer(tmp_path, logger="tensorboard")


def test_tensorboard_logger_writes_event_files(tmp_path):
    pytest.importorskip("tensorboard", reason="TensorBoard is optional: pip install 'stratagem[tensorboard]'")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    trainer = quiet_trainer(tmp_path, max_steps=4, logger=["tensorboard", "csv"], log_every_n_steps=2)
    assert isinstance(trainer.logger, TensorBoardLogger)
    pickle.loads(pickle.dumps(trainer.logger))
    trainer.fit(ClassifierModule(), make_loader())
    events = EventAccumulator(trainer.logger.log_dir)
    events.Reload()
    assert [event.step for event in events.Scalars("train_loss")] == [2, 4]
    assert (tmp_path / "csv_logs" / "version_0" / "metrics.csv").is_file()


def test_claiming_versions_at_the_same_moment_gives_each_claimant_its_own(tmp_path):
    (tmp_path / "version_3").mkdir(parents=True)
    barrier = threading.Barrier(8)

    def claim():
        barrier.wait(timeout=30)
        return claim_next_version(tmp_path)

    with ThreadPoolExecutor(8) as pool:
        versions = list(pool.map(lambda _: claim(), range(8)))
    assert sorted(versions) == list(range(4, 12))


def test_a_logger_adopts_an_offered_version_only_when_it_has_none_and_the_directory_is_free(tmp_path):
    free, taken, chosen = (CSVLogger(tmp_path, name=name) for name in ("free", "taken", "chosen"))
    (tmp_path / "taken" / "version_5").mkdir(parents=True)
    assert chosen.version == 0
    for logger in (free, taken, chosen):
        logger.adopt_version(5)
    assert (free.version, taken.version, chosen.version) == (5, 6, 0)
