import os
from pathlib import Path

import pytest
from trainer_testing import ClassifierModule, make_loader, quiet_trainer

import stratagem
from stratagem.callbacks import ModelCheckpoint, ProgressBar
from stratagem.loggers import CSVLogger


@pytest.mark.parametrize(
    ("option", "value", "error", "message"),
    [
        ("max_epochs", -2, ValueError, r"max_epochs=-2 is not valid; expected None, -1"),
        ("max_epochs", 1.5, TypeError, r"max_epochs=1.5 \(float\)"),
        ("max_steps", 0, ValueError, r"max_steps=0 is not valid"),
        ("max_steps", True, TypeError, r"max_steps=True"),
        ("limit_train_batches", 1.5, ValueError, r"limit_train_batches=1.5 .* fraction"),
        ("limit_val_batches", -1, ValueError, r"limit_val_batches=-1"),
        ("limit_test_batches", "all", TypeError, r"limit_test_batches='all'"),
        ("limit_predict_batches", None, TypeError, r"limit_predict_batches=None"),
        ("val_check_interval", 0.0, ValueError, r"val_check_interval=0.0 .* \(0, 1\]"),
        ("val_check_interval", 0, ValueError, r"val_check_interval=0"),
        ("check_val_every_n_epoch", 0, ValueError, r"check_val_every_n_epoch=0 .* positive int"),
        ("num_sanity_val_steps", -2, ValueError, r"num_sanity_val_steps=-2"),
        ("accumulate_grad_batches", 0, ValueError, r"accumulate_grad_batches=0 .* positive int"),
        ("gradient_clip_val", -1.0, ValueError, r"gradient_clip_val=-1.0"),
        ("gradient_clip_val", float("nan"), ValueError, r"gradient_clip_val=nan .* finite number >= 0"),
        ("gradient_clip_val", float("inf"), ValueError, r"gradient_clip_val=inf .* finite number >= 0"),
        ("gradient_clip_val", "1", TypeError, r"gradient_clip_val='1'"),
        ("gradient_clip_algorithm", "l2", ValueError, r"gradient_clip_algorithm='l2' .* 'norm' or 'value'"),
        ("default_root_dir", 3, TypeError, r"default_root_dir=3"),
        ("log_every_n_steps", 0, ValueError, r"log_every_n_steps=0"),
        ("deterministic", "yes", TypeError, r"deterministic='yes'"),
        ("seed", -1, ValueError, r"seed=-1"),
        (
            "seed",
            2**70,
            ValueError,
            r"seed=1180591620717411303424 is not valid; expected None or an int in \[0, 2\*\*63",
        ),
        ("seed", 2**63, ValueError, r"seed=9223372036854775808 is not valid"),
        ("seed", "1", TypeError, r"seed='1' \(str\)"),
        ("use_distributed_sampler", 1, TypeError, r"use_distributed_sampler=1"),
        ("enable_progress_bar", None, TypeError, r"enable_progress_bar=None"),
        ("enable_checkpointing", "no", TypeError, r"enable_checkpointing='no'"),
        ("logger", "wandb", ValueError, r"logger='wandb' is not valid; expected True, False, None, 'csv'"),
        ("logger", 3, TypeError, r"logger=3"),
        ("callbacks", [object()], TypeError, r"callbacks= contains <object"),
        ("precision", "8-true", ValueError, r"precision='8-true' is not valid; expected one of .*'bf16-mixed'"),
        ("strategy", "no_such_strategy", ValueError, r"no_such_strategy"),
        ("accelerator", "tpu9", ValueError, r"tpu9"),
        ("devices", 0, ValueError, r"devices=0 is not valid"),
        ("devices", 1000000, ValueError, r"devices=1000000 asks for 1000000 CPU processes"),
        ("num_nodes", 0, ValueError, r"num_nodes=0"),
        ("plugins", 42, TypeError, r"plugins=42 \(int\) is not valid"),
        ("max_time", "1:00", ValueError, r"max_time='1:00' is not valid; a string must be DD:HH:MM:SS"),
        ("max_time", {"hour": 1}, ValueError, r"max_time=\{'hour': 1\} is not valid: unknown keys \['hour'\]"),
        ("max_time", {"hours": "1"}, TypeError, r"hours='1' is not a number"),
        ("max_time", 3600, TypeError, r"max_time=3600 \(int\) is not valid; expected None, a datetime.timedelta"),
        ("max_time", "00:00:00:00", ValueError, r"max_time='00:00:00:00' is not valid; it must be a positive"),
        ("fast_dev_run", -1, ValueError, r"fast_dev_run=-1 is not valid; expected True, False, or a number"),
        ("fast_dev_run", "yes", TypeError, r"fast_dev_run='yes' \(str\)"),
    ],
)
def test_a_bad_option_fails_at_construction_naming_option_and_value(tmp_path, option, value, error, message):
    options = {"accelerator": "cpu", "default_root_dir": tmp_path, option: value}
    with pytest.raises(error, match=message):
        stratagem.Trainer(**options)


def test_the_largest_seed_is_accepted(tmp_path):
    assert stratagem.Trainer(accelerator="cpu", default_root_dir=tmp_path, seed=2**63 - 1).settings.seed == 2**63 - 1


def test_a_default_root_dir_that_is_a_file_or_under_one_fails_at_construction(tmp_path):
    file = tmp_path / "notes.txt"
    file.write_text("")
    with pytest.raises(ValueError, match=r"default_root_dir='.*notes\.txt' is not valid: it exists and is not a dir"):
        stratagem.Trainer(accelerator="cpu", default_root_dir=file)
    with pytest.raises(
        ValueError, match=r"default_root_dir='.*notes\.txt/runs/a' is not valid: .*notes\.txt' is a file"
    ):
        stratagem.Trainer(accelerator="cpu", default_root_dir=file / "runs" / "a")


@pytest.mark.parametrize("missing", [False, True])
def test_an_unwritable_default_root_dir_fails_at_construction(tmp_path, monkeypatch, missing):
    # Checked through os.access, which also answers for read-only file systems; this user may be root,
    # whom permission bits do not stop, so the answer is stood in for.
    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != locked and real_access(path, mode))
    root = locked / "run" if missing else locked
    with pytest.raises(ValueError, match=r"default_root_dir='.*locked(/run)?' is not writable: this process may not"):
        stratagem.Trainer(accelerator="cpu", default_root_dir=root)


def test_a_default_root_dir_that_does_not_exist_yet_is_accepted(tmp_path):
    trainer = stratagem.Trainer(accelerator="cpu", default_root_dir=tmp_path / "new" / "run")
    assert trainer.default_root_dir == tmp_path / "new" / "run"


def test_check_val_every_n_epoch_none_needs_an_interval_in_batches(tmp_path):
    with pytest.raises(ValueError, match=r"check_val_every_n_epoch=None needs val_check_interval as a number"):
        stratagem.Trainer(accelerator="cpu", check_val_every_n_epoch=None, default_root_dir=tmp_path)


def test_callbacks_that_contradict_the_switches_are_refused(tmp_path):
    with pytest.raises(ValueError, match="ModelCheckpoint but enable_checkpointing=False"):
        stratagem.Trainer(accelerator="cpu", enable_checkpointing=False, callbacks=[ModelCheckpoint()])
    with pytest.raises(ValueError, match="ProgressBar but enable_progress_bar=False"):
        stratagem.Trainer(accelerator="cpu", enable_progress_bar=False, callbacks=ProgressBar())
    with pytest.raises(ValueError, match="same state_key"):
        stratagem.Trainer(accelerator="cpu", callbacks=[ModelCheckpoint(), ModelCheckpoint()])


def test_defaults_add_a_progress_bar_first_and_checkpointing_last_and_a_csv_logger(tmp_path):
    from stratagem.callbacks import EarlyStopping, ModelSummary

    stopper = EarlyStopping("val_loss")
    trainer = stratagem.Trainer(accelerator="cpu", callbacks=[stopper], default_root_dir=tmp_path)
    kinds = [type(callback) for callback in trainer.callbacks]
    assert kinds == [ProgressBar, EarlyStopping, ModelSummary, ModelCheckpoint]
    assert isinstance(trainer.logger, CSVLogger)
    assert trainer.log_dir == str(tmp_path / "csv_logs" / "version_0")


def test_the_attributes_describe_a_single_device_run(tmp_path):
    trainer = quiet_trainer(tmp_path)
    assert (trainer.world_size, trainer.global_rank, trainer.is_global_zero) == (1, 0, True)
    assert trainer.max_epochs == 1000
    assert quiet_trainer(tmp_path, max_steps=10).max_epochs == -1
    assert type(trainer.strategy).__name__ == "SingleDeviceStrategy"


def test_fit_refuses_a_plain_nn_module_and_a_missing_checkpoint(tmp_path):
    import torch

    trainer = quiet_trainer(tmp_path, max_steps=1)
    with pytest.raises(TypeError, match=r"needs a stratagem.Module; got Linear"):
        trainer.fit(torch.nn.Linear(2, 2), make_loader())
    with pytest.raises(FileNotFoundError, match=r"nowhere\.ckpt"):
        trainer.fit(ClassifierModule(), make_loader(), ckpt_path=tmp_path / "nowhere.ckpt")
    with pytest.raises(ValueError, match="ckpt_path='best' needs a ModelCheckpoint"):
        trainer.validate(ClassifierModule(), make_loader(), ckpt_path="best")
    with pytest.raises(TypeError, match="weights_only='no'"):
        trainer.fit(ClassifierModule(), make_loader(), weights_only="no")


def test_fit_without_any_data_says_what_is_missing(tmp_path):
    with pytest.raises(NotImplementedError, match="no train_dataloaders"):
        quiet_trainer(tmp_path, max_steps=1).fit(ClassifierModule())
    with pytest.raises(ValueError, match=r"Trainer.validate\(\) got no dataloaders"):
        quiet_trainer(tmp_path).validate(ClassifierModule())


def test_a_missing_configure_optimizers_is_explained(tmp_path):
    class NoOptimizer(ClassifierModule):
        configure_optimizers = stratagem.Module.configure_optimizers

    with pytest.raises(NotImplementedError, match="configure_optimizers"):
        quiet_trainer(tmp_path, max_steps=1).fit(NoOptimizer(), make_loader())
