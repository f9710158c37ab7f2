"""Lightning's DeepSpeedStrategy options and spellings, as a Lightning user passes them: each lands in the
DeepSpeed config where Lightning puts it, or is refused naming what to write instead. All in the calling
process, before any process starts."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

import stratagem
from stratagem_deepspeed import DeepSpeedStrategy
from stratagem_deepspeed.config import CONFIG_PATH_VARIABLE, LIGHTNING_CONFIG_PATH_VARIABLE

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def _no_config_from_the_environment(monkeypatch):
    monkeypatch.delenv(CONFIG_PATH_VARIABLE, raising=False)
    monkeypatch.delenv(LIGHTNING_CONFIG_PATH_VARIABLE, raising=False)
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")


def resolve(strategy, precision="32-true"):
    return stratagem.resolve(strategy=strategy, accelerator="cpu", devices=2, precision=precision)


def test_lightnings_offload_and_nvme_options_are_written_where_lightning_writes_them():
    strategy = DeepSpeedStrategy(
        stage=3, offload_optimizer=True, offload_parameters=True, pin_memory=True, sub_group_size=1_000_000,
        optimizer_buffer_count=5, params_buffer_count=6, params_buffer_size=1_000, max_in_cpu=2_000,
        block_size=4096, queue_depth=4, single_submit=True, overlap_events=False, thread_count=2,
        allgather_partitions=False, reduce_scatter=False,
    )  # fmt: skip
    config = resolve(strategy).config
    zero = config["zero_optimization"]
    assert zero["sub_group_size"] == 1_000_000
    assert zero["allgather_partitions"] is False
    assert zero["reduce_scatter"] is False
    assert zero["offload_optimizer"] == {
        "device": "cpu",
        "nvme_path": "/local_nvme",
        "pin_memory": True,
        "buffer_count": 5,
    }
    assert zero["offload_param"] == {
        "device": "cpu", "nvme_path": "/local_nvme", "pin_memory": True, "buffer_count": 6, "buffer_size": 1_000,
        "max_in_cpu": 2_000,
    }  # fmt: skip
    assert config["aio"] == {
        "block_size": 4096, "queue_depth": 4, "single_submit": True, "overlap_events": False, "thread_count": 2,
    }  # fmt: skip


def test_pin_memory_without_an_offload_writes_no_offload_section():
    zero = resolve(DeepSpeedStrategy(stage=2, pin_memory=True)).config["zero_optimization"]
    assert "offload_optimizer" not in zero
    assert "offload_param" not in zero


def test_activation_checkpointing_options_go_into_the_activation_checkpointing_section():
    strategy = DeepSpeedStrategy(partition_activations=True, synchronize_checkpoint_boundary=True)
    section = resolve(strategy).config["activation_checkpointing"]
    assert section["partition_activations"] is True
    assert section["synchronize_checkpoint_boundary"] is True


def test_loss_scaling_options_fill_the_fp16_section_and_warn_when_the_run_is_not_fp16():
    strategy = DeepSpeedStrategy(loss_scale=0, initial_scale_power=12, loss_scale_window=500, hysteresis=3)
    with pytest.warns(UserWarning, match=r"initial_scale_power=12.*only '16-mixed' scales the loss"):
        config = resolve(strategy, precision="bf16-mixed").config
    assert "fp16" not in config


def test_logging_batch_size_per_gpu_is_the_micro_batch_until_the_loader_says_otherwise():
    config = resolve(DeepSpeedStrategy(logging_batch_size_per_gpu=4)).config
    assert config["train_micro_batch_size_per_gpu"] == 4
    assert config["train_batch_size"] == 8


def test_zero_optimization_false_means_stage_0_and_load_full_weights_is_accepted():
    config = resolve(DeepSpeedStrategy(zero_optimization=False, load_full_weights=True)).config
    assert config["zero_optimization"]["stage"] == 0


def test_precision_plugin_is_refused_naming_precision():
    with pytest.raises(TypeError, match=r"precision_plugin=.*stratagem's is precision="):
        DeepSpeedStrategy(precision_plugin=object())


def test_an_unknown_option_is_refused_with_close_names():
    with pytest.raises(TypeError, match=r"'sub_group_sise'.*sub_group_size"):
        DeepSpeedStrategy(sub_group_sise=10)


def test_a_lightning_option_beside_a_config_is_refused_naming_the_config_key():
    with pytest.raises(
        ValueError, match=r"pin_memory=True.*'zero_optimization' -> 'offload_optimizer' -> 'pin_memory'"
    ):
        DeepSpeedStrategy(config={"zero_optimization": {"stage": 2}}, pin_memory=True)


def test_the_pages_boolean_offload_optimizer_means_offload_to_cpu():
    config = {"zero_optimization": {"stage": 2, "offload_optimizer": True}}
    resolved = resolve(DeepSpeedStrategy(config=config))
    assert resolved.config["zero_optimization"]["offload_optimizer"] == {"device": "cpu"}
    assert config["zero_optimization"]["offload_optimizer"] is True, "the user's dict is left as it was"


def test_pl_deepspeed_config_path_is_read_like_stratagems_variable(tmp_path, monkeypatch):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 1}}))
    monkeypatch.setenv(LIGHTNING_CONFIG_PATH_VARIABLE, str(path))
    assert resolve("deepspeed").zero_stage == 1


def test_both_config_path_variables_naming_different_files_are_refused(tmp_path, monkeypatch):
    for name, stage in (("a.json", 1), ("b.json", 3)):
        (tmp_path / name).write_text(json.dumps({"zero_optimization": {"stage": stage}}))
    monkeypatch.setenv(CONFIG_PATH_VARIABLE, str(tmp_path / "a.json"))
    monkeypatch.setenv(LIGHTNING_CONFIG_PATH_VARIABLE, str(tmp_path / "b.json"))
    with pytest.raises(ValueError, match="unset one of them"):
        resolve("deepspeed")


def test_a_torch_optimizer_in_the_config_without_zero_allow_untested_optimizer_is_refused_before_launch():
    config = {"optimizer": {"type": "SGD", "params": {"lr": 0.1}}, "zero_optimization": {"stage": 2}}
    with pytest.raises(ValueError, match='"zero_allow_untested_optimizer": true'):
        resolve(DeepSpeedStrategy(config=config))


def test_the_strategy_supplies_the_optimizer_only_when_the_config_has_one():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plain = resolve(DeepSpeedStrategy())
    assert not plain.supplies_optimizer
    config = {"zero_allow_untested_optimizer": True, "optimizer": {"type": "SGD", "params": {"lr": 0.1}}}
    assert resolve(DeepSpeedStrategy(config=config)).supplies_optimizer


class _ManuallyOptimized(stratagem.Module):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.layer = torch.nn.Linear(2, 1)
        self.stepped = False

    def training_step(self, batch, batch_idx):
        self.stepped = True

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_manual_optimization_is_refused_because_the_engine_owns_the_step_before_any_process_starts(tmp_path):
    trainer = stratagem.Trainer(
        strategy=DeepSpeedStrategy(stage=2),
        accelerator="cpu",
        devices=2,
        max_steps=1,
        logger=False,
        default_root_dir=tmp_path,
    )
    module = _ManuallyOptimized()
    with pytest.raises(ValueError, match=r"DeepSpeedStrategy cannot run: its engine runs backward and the optimizer"):
        trainer.fit(module, [torch.ones(1, 2)])
    assert not module.stepped
