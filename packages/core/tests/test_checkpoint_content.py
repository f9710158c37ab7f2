import pytest
import torch
from trainer_testing import ClassifierModule, make_loader, quiet_trainer

from stratagem.callbacks import Callback
from stratagem.checkpoint_io import CheckpointError, TorchCheckpointIO
from stratagem.trainer.checkpointing import announce_loaded

EXPECTED_KEYS = {
    "module",
    "optimizers",
    "lr_schedulers",
    "loops",
    "rng",
    "callbacks",
    "precision",
    "saved_by",
    "format_version",
    "stratagem_version",
}


class _Counter(Callback):
    def __init__(self):
        self.batches = 0

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.batches += 1

    def state_dict(self):
        return {"batches": self.batches}

    def load_state_dict(self, state):
        self.batches = state["batches"]


def _scheduled(optimizer):
    return torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)


def test_a_checkpoint_holds_every_part_of_the_run_and_loads_weights_only(tmp_path):
    module = ClassifierModule(optimizer="adam", scheduler=_scheduled)
    trainer = quiet_trainer(tmp_path, max_steps=5, callbacks=[_Counter()], precision="16-mixed")
    trainer.fit(module, make_loader())
    trainer.save_checkpoint(tmp_path / "run.ckpt")

    checkpoint = torch.load(tmp_path / "run.ckpt", weights_only=True)
    assert set(checkpoint) == EXPECTED_KEYS
    assert checkpoint["format_version"] == 1
    assert all(torch.equal(checkpoint["module"][k], v) for k, v in module.state_dict().items())
    assert checkpoint["optimizers"][0]["state"][0]["step"] == 5
    assert checkpoint["lr_schedulers"][0]["last_epoch"] == 0
    assert checkpoint["loops"]["fit"]["global_step"] == 5
    assert checkpoint["loops"]["fit"]["batches_in_epoch"] == 5
    assert set(checkpoint["loops"]["fit"]["epoch_start"]) == {"rng", "loader_generators"}
    assert {"torch", "python"} <= set(checkpoint["rng"])
    assert checkpoint["callbacks"] == {"_Counter": {"batches": 5}}
    assert "scale" in checkpoint["precision"]["scaler"]
    assert checkpoint["saved_by"] == {"strategy": "SingleDeviceStrategy", "precision": "16-mixed", "world_size": 1}


def test_module_and_callback_hooks_add_and_read_their_own_entries(tmp_path):
    seen = {}

    class Hooked(ClassifierModule):
        def on_save_checkpoint(self, checkpoint):
            checkpoint["extra"] = {"note": "kept"}

        def on_load_checkpoint(self, checkpoint):
            seen["module"] = checkpoint["extra"]

    class Reader(_Counter):
        def on_load_checkpoint(self, trainer, module, checkpoint):
            seen["callback"] = (self.batches, checkpoint["loops"]["fit"]["global_step"])

    trainer = quiet_trainer(tmp_path, max_steps=3, callbacks=[Reader()])
    trainer.fit(Hooked(), make_loader())
    trainer.save_checkpoint(tmp_path / "run.ckpt")
    resumed = quiet_trainer(tmp_path, max_steps=4, callbacks=[Reader()])
    resumed.fit(Hooked(), make_loader(), ckpt_path=tmp_path / "run.ckpt")
    assert seen == {"module": {"note": "kept"}, "callback": (3, 3)}
    assert resumed.callbacks[0].batches == 4


def test_a_checkpoint_with_arbitrary_objects_needs_an_explicit_opt_out(tmp_path):
    class Unsafe(ClassifierModule):
        def on_save_checkpoint(self, checkpoint):
            checkpoint["object"] = _Opaque()

    trainer = quiet_trainer(tmp_path, max_steps=1)
    trainer.fit(Unsafe(), make_loader())
    trainer.save_checkpoint(tmp_path / "unsafe.ckpt")
    with pytest.raises(CheckpointError, match="weights_only=False"):
        quiet_trainer(tmp_path, max_steps=2).fit(ClassifierModule(), make_loader(), ckpt_path=tmp_path / "unsafe.ckpt")
    trainer = quiet_trainer(tmp_path, max_steps=2)
    trainer.fit(ClassifierModule(), make_loader(), ckpt_path=tmp_path / "unsafe.ckpt", weights_only=False)
    assert trainer.global_step == 2


class _Opaque:
    pass


def test_a_checkpoint_from_a_newer_format_is_refused(tmp_path):
    trainer = quiet_trainer(tmp_path, max_steps=1)
    trainer.fit(ClassifierModule(), make_loader())
    trainer.save_checkpoint(tmp_path / "run.ckpt")
    checkpoint = torch.load(tmp_path / "run.ckpt", weights_only=True)
    checkpoint["format_version"] = 99
    TorchCheckpointIO().save_checkpoint(checkpoint, tmp_path / "future.ckpt")
    with pytest.raises(ValueError, match="checkpoint format 99, newer than this stratagem reads"):
        quiet_trainer(tmp_path).validate(ClassifierModule(), make_loader(), ckpt_path=tmp_path / "future.ckpt")


def test_a_plain_weights_file_loads_for_evaluation(tmp_path):
    trained = ClassifierModule()
    TorchCheckpointIO().save_checkpoint({"module": trained.state_dict()}, tmp_path / "weights.ckpt")
    fresh = ClassifierModule()
    quiet_trainer(tmp_path).test(fresh, make_loader(), ckpt_path=tmp_path / "weights.ckpt")
    assert torch.equal(fresh.layers[0].weight, trained.layers[0].weight)


def test_save_checkpoint_before_any_run_explains_itself(tmp_path):
    with pytest.raises(RuntimeError, match="needs a module"):
        quiet_trainer(tmp_path).save_checkpoint(tmp_path / "x.ckpt")


def test_scheduler_count_mismatch_is_refused(tmp_path):
    trainer = quiet_trainer(tmp_path, max_steps=1)
    trainer.fit(ClassifierModule(scheduler=_scheduled), make_loader())
    trainer.save_checkpoint(tmp_path / "run.ckpt")
    with pytest.raises(ValueError, match=r"holds 1 lr scheduler state\(s\), but configure_optimizers\(\) created 0"):
        quiet_trainer(tmp_path, max_steps=2).fit(ClassifierModule(), make_loader(), ckpt_path=tmp_path / "run.ckpt")


def test_loading_says_which_checkpoint_and_shows_only_plain_values_of_what_saved_it(tmp_path, capsys):
    trainer = quiet_trainer(tmp_path)
    saved = {
        "loops": {"fit": {"epoch": 1, "global_step": 40}},
        "saved_by": {"strategy": "FSDPStrategy", "precision": "32-true", "world_size": 2},
    }
    announce_loaded(trainer, "a.ckpt", saved, "resuming from")
    announce_loaded(trainer, "b.ckpt", {"loops": [1], "saved_by": {"strategy": ["x"], "precision": None}}, "loaded")
    assert capsys.readouterr().err.splitlines() == [
        "stratagem: resuming from a.ckpt (epoch 1, step 40); it was saved with strategy FSDPStrategy, world_size 2, "
        "this run uses strategy SingleDeviceStrategy, world_size 1",
        "stratagem: loaded b.ckpt",
    ]


def test_validating_from_a_checkpoint_says_whose_weights_it_loaded(tmp_path, capsys):
    trainer = quiet_trainer(tmp_path, max_steps=2)
    trainer.fit(ClassifierModule(), make_loader())
    trainer.save_checkpoint(tmp_path / "run.ckpt")
    capsys.readouterr()
    quiet_trainer(tmp_path).validate(ClassifierModule(), make_loader(), ckpt_path=tmp_path / "run.ckpt")
    assert capsys.readouterr().err.splitlines() == [
        f"stratagem: loaded the weights of {tmp_path / 'run.ckpt'} (epoch 0, step 2)"
    ]
