"""The DeepSpeed config: options, dict / JSON file / environment variable, and reconciliation with
the Trainer. Everything here happens in the calling process, before any process starts."""

from __future__ import annotations

import json

import pytest

import stratagem
from stratagem.strategies import BackwardSyncControl, LoopSettings, OwnsAccumulation
from stratagem_deepspeed import DeepSpeedStrategy
from stratagem_deepspeed.config import CONFIG_PATH_VARIABLE, LIGHTNING_CONFIG_PATH_VARIABLE

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def _no_config_from_the_environment(monkeypatch):
    monkeypatch.delenv(CONFIG_PATH_VARIABLE, raising=False)
    monkeypatch.delenv(LIGHTNING_CONFIG_PATH_VARIABLE, raising=False)
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")


def resolve(strategy="deepspeed", precision="32-true", devices=2, settings=None):
    resolved = stratagem.resolve(strategy=strategy, accelerator="cpu", devices=devices, precision=precision)
    if settings is not None:
        resolved.connect_loop_settings(settings)
    return resolved


def test_the_options_build_the_config_and_the_trainer_fills_in_precision_accumulation_clipping_and_batch():
    strategy = resolve(
        DeepSpeedStrategy(stage=3, offload_optimizer=True, offload_parameters=True, reduce_bucket_size=1e6),
        precision="bf16-mixed",
        settings=LoopSettings(accumulate_grad_batches=4, gradient_clip_val=1.5),
    )
    config = strategy.config
    assert config["zero_optimization"]["stage"] == 3
    assert config["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert config["zero_optimization"]["offload_param"]["device"] == "cpu"
    assert config["zero_optimization"]["reduce_bucket_size"] == 1_000_000
    # Sized to the model once the worker has it (stratagem_deepspeed.buffer_sizes): on the CPU, unset until then.
    assert "allgather_bucket_size" not in config["zero_optimization"]
    assert config["bf16"] == {"enabled": True}
    assert "fp16" not in config
    assert config["gradient_accumulation_steps"] == 4
    assert config["gradient_clipping"] == 1.5
    assert config["train_micro_batch_size_per_gpu"] == 1
    assert config["train_batch_size"] == 1 * 4 * 2


@pytest.mark.parametrize(
    ("alias", "stage", "offloads"),
    [
        ("deepspeed", 2, {}),
        ("deepspeed_stage_1", 1, {}),
        ("deepspeed_stage_1_offload", 1, {"offload_optimizer": "cpu"}),
        ("deepspeed_stage_2", 2, {}),
        ("deepspeed_stage_2_offload", 2, {"offload_optimizer": "cpu"}),
        ("deepspeed_stage_3", 3, {}),
        ("deepspeed_stage_3_offload", 3, {"offload_optimizer": "cpu", "offload_param": "cpu"}),
    ],
)
def test_each_alias_selects_its_stage_and_offload(alias, stage, offloads):
    zero = resolve(alias).config["zero_optimization"]
    assert zero["stage"] == stage
    assert {key: zero[key]["device"] for key in ("offload_optimizer", "offload_param") if key in zero} == offloads


def test_a_config_dict_replaces_the_options_but_not_the_trainer_settings():
    config = {"zero_optimization": {"stage": 1}, "steps_per_print": 7}
    strategy = resolve(DeepSpeedStrategy(stage=3, offload_optimizer=True, config=config), precision="bf16-mixed")
    assert strategy.config["zero_optimization"] == {"stage": 1}
    assert strategy.config["steps_per_print"] == 7
    assert strategy.config["bf16"] == {"enabled": True}
    assert config == {"zero_optimization": {"stage": 1}, "steps_per_print": 7}, "the user's dict is not modified"


def test_a_json_config_file_is_read(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 3}}))
    assert resolve(DeepSpeedStrategy(config=str(path))).zero_stage == 3


def test_the_environment_variable_names_the_config_when_none_is_given(tmp_path, monkeypatch):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 1}}))
    monkeypatch.setenv(CONFIG_PATH_VARIABLE, str(path))
    assert resolve("deepspeed_stage_3").zero_stage == 1
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"zero_optimization": {"stage": 2}}))
    assert resolve(DeepSpeedStrategy(config=str(other))).zero_stage == 2, "an explicit config wins"


def test_a_missing_or_broken_config_file_names_its_origin(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match=r"config='.*nothing\.json'\) names no file"):
        DeepSpeedStrategy(config=str(tmp_path / "nothing.json"))
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    monkeypatch.setenv(CONFIG_PATH_VARIABLE, str(broken))
    with pytest.raises(ValueError, match=rf"{CONFIG_PATH_VARIABLE}=.*not valid JSON"):
        DeepSpeedStrategy()
    with pytest.raises(TypeError, match=r"config=3\) has type int; expected a dict or the path"):
        DeepSpeedStrategy(config=3)


def test_a_bad_config_key_surfaces_deepspeeds_own_error_naming_it_before_launch():
    strategy = DeepSpeedStrategy(config={"zero_optimization": {"stage": 2, "overlap_comms": True}})
    with pytest.raises(ValueError, match=r"DeepSpeed rejects the config: ValidationError(.|\n)*overlap_comms"):
        resolve(strategy)


def test_a_misspelt_top_level_key_is_refused_before_launch_suggesting_the_right_one(tmp_path):
    # DeepSpeed's config class ignores top-level keys it does not look up: this ran as ZeRO stage 0.
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps({"zero_optimisation": {"stage": 3}, "bf16": {"enabled": True}}))
    expected = (
        r"top-level key\(s\) DeepSpeed does not read.*'zero_optimisation' \(did you mean 'zero_optimization'\?\)\.$"
    )
    with pytest.raises(ValueError, match=expected):
        resolve(DeepSpeedStrategy(config=str(path)), precision="bf16-mixed")


def test_a_top_level_key_like_none_of_deepspeeds_is_refused_listing_the_keys_deepspeed_reads():
    with pytest.raises(ValueError, match=r"'learning_rate'\. The keys DeepSpeed reads: activation_checkpointing, .*"
                       r"optimizer, .*zero_optimization\."):  # fmt: skip
        resolve(DeepSpeedStrategy(config={"zero_optimization": {"stage": 2}, "learning_rate": 0.1}))


def test_a_config_using_many_of_deepspeeds_sections_is_accepted():
    config = {
        "zero_optimization": {"stage": 1},
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}},
        "steps_per_print": 10,
        "wall_clock_breakdown": False,
        "flops_profiler": {"enabled": False},
        "tensorboard": {"enabled": False},
        "activation_checkpointing": {"partition_activations": False},
        "comms_logger": {"enabled": False},
        "zero_allow_untested_optimizer": True,
        "gradient_clipping": 0.0,
        "train_micro_batch_size_per_gpu": 1,
    }
    assert resolve(DeepSpeedStrategy(config=config)).config["steps_per_print"] == 10


@pytest.mark.parametrize("precision", ["16-mixed", "16-true"])
def test_fp16_on_cpu_is_refused_before_launch_suggesting_bf16(precision):
    with pytest.raises(ValueError, match=rf"precision='{precision}'.*accelerator='cpu'.*'bf16-mixed'"):
        resolve("deepspeed_stage_2", precision=precision)


def test_cpu_checkpointing_on_cpu_is_refused_before_launch():
    with pytest.raises(ValueError, match=r"cpu_checkpointing=True.*accelerator='cpu'.*cpu_checkpointing=False"):
        resolve(DeepSpeedStrategy(stage=3, cpu_checkpointing=True, partition_activations=True))
    config = {"activation_checkpointing": {"cpu_checkpointing": True}}
    with pytest.raises(ValueError, match=r"the DeepSpeed config enables activation_checkpointing.cpu_checkpointing"):
        resolve(DeepSpeedStrategy(config=config))


def test_a_config_precision_that_contradicts_the_trainer_is_an_error_naming_both():
    with pytest.raises(ValueError, match=r"enables fp16 .* precision is 'bf16-mixed'.*precision='16-mixed'"):
        resolve(DeepSpeedStrategy(config={"fp16": {"enabled": True}}), precision="bf16-mixed")
    with pytest.raises(ValueError, match=r"enables bf16 .* precision is '32-true'.*precision='bf16-mixed'"):
        resolve(DeepSpeedStrategy(config={"bf16": {"enabled": True}}))


def test_a_precision_deepspeed_cannot_train_in_is_refused_listing_those_it_can():
    with pytest.raises(ValueError, match=r"precision='64-true' is not supported.*'32-true'.*'bf16-mixed'"):
        resolve("deepspeed", precision="64-true")


def test_accumulation_in_the_config_must_agree_with_the_trainer():
    strategy = DeepSpeedStrategy(config={"gradient_accumulation_steps": 4})
    resolve(strategy, settings=LoopSettings(accumulate_grad_batches=4))
    with pytest.raises(ValueError, match=r"gradient_accumulation_steps=4.*accumulate_grad_batches=2"):
        strategy.connect_loop_settings(LoopSettings(accumulate_grad_batches=2))


def test_clipping_comes_from_either_place_and_two_different_values_are_an_error():
    assert resolve(DeepSpeedStrategy(config={"gradient_clipping": 2.0})).config["gradient_clipping"] == 2.0
    strategy = resolve(DeepSpeedStrategy(config={"gradient_clipping": 2.0}))
    with pytest.raises(ValueError, match=r"gradient_clipping=2.0.*gradient_clip_val=1.0"):
        strategy.connect_loop_settings(LoopSettings(gradient_clip_val=1.0))
    with pytest.raises(ValueError, match=r"gradient_clip_algorithm='value'.*'norm'"):
        resolve("deepspeed", settings=LoopSettings(gradient_clip_val=1.0, gradient_clip_algorithm="value"))


@pytest.mark.parametrize("value", [float("nan"), -1.0, "abc", True])
def test_a_clipping_value_deepspeed_would_never_clip_with_is_refused_naming_it(value):
    with pytest.raises(ValueError, match=r"gradient_clipping"):
        resolve(DeepSpeedStrategy(config={"gradient_clipping": value}), settings=LoopSettings())


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"gradient_clipping": NaN}', "NaN is not a number"),
        ('{"gradient_clipping": 1e400}', "the number 1e400 is beyond what a float holds"),
        ('{"zero_optimization": {"stage": -Infinity}}', "-Infinity is not a number"),
        ('{"a": ' + "[" * 10_000 + "]" * 10_000 + "}", "the JSON is nested too deeply"),
    ],
    ids=["nan", "overflow", "infinity", "nested 10000 deep"],
)
def test_a_json_config_with_a_number_beyond_a_float_or_nested_too_deep_names_the_file(tmp_path, text, message):
    path = tmp_path / "ds.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=rf"config='.*ds\.json'\): {message}"):
        DeepSpeedStrategy(config=str(path))


def test_a_config_dict_with_infinity_names_the_key():
    with pytest.raises(ValueError, match=r"config=\.\.\.\): zero_optimization.reduce_bucket_size is inf"):
        DeepSpeedStrategy(config={"zero_optimization": {"reduce_bucket_size": float("inf")}})


def test_batch_sizes_in_the_config_must_multiply_out():
    strategy = resolve(DeepSpeedStrategy(config={"train_micro_batch_size_per_gpu": 8}))
    assert strategy.config["train_batch_size"] == 16
    with pytest.raises(ValueError, match=r"train_batch_size=10, but micro batch 8 x accumulate_grad_batches 1 x 2"):
        resolve(DeepSpeedStrategy(config={"train_micro_batch_size_per_gpu": 8, "train_batch_size": 10}))
    assert resolve(DeepSpeedStrategy(config={"train_batch_size": 12})).config["train_micro_batch_size_per_gpu"] == 6


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"stage": 4}, r"stage=4\) is not valid; expected 0, 1, 2 or 3"),
        ({"stage": 2, "offload_parameters": True}, r"offload_parameters=True\) needs ZeRO stage 3"),
        ({"stage": 0, "offload_optimizer": True}, r"offload_optimizer=True\) needs ZeRO stage 1, 2 or 3"),
        ({"offload_optimizer_device": "disk"}, r"offload_optimizer_device='disk'.*'cpu' or 'nvme'"),
        ({"remote_device": "gpu"}, r"remote_device='gpu'.*None, 'cpu' or 'nvme'"),
        ({"reduce_bucket_size": 0}, r"reduce_bucket_size=0.*positive"),
        ({"start_method": "thread"}, r"start_method='thread' is not valid"),
    ],
)
def test_invalid_options_name_the_option_and_what_is_accepted(options, message):
    with pytest.raises(ValueError, match=message):
        DeepSpeedStrategy(**options)


def test_ds_accelerator_contradicting_the_run_is_refused(monkeypatch):
    monkeypatch.setenv("DS_ACCELERATOR", "cuda")
    with pytest.raises(ValueError, match=r"DS_ACCELERATOR='cuda'.*accelerator='cpu'"):
        resolve("deepspeed")


def test_the_strategy_declares_that_its_engine_owns_accumulation_and_one_optimizer():
    strategy = resolve("deepspeed_stage_3")
    assert isinstance(strategy, OwnsAccumulation)
    assert not isinstance(strategy, BackwardSyncControl)
    assert type(strategy).max_optimizers == 1
    assert strategy.distributed_sampler_kwargs == {"num_replicas": 2, "rank": 0}


def test_an_nvme_path_that_cannot_be_created_is_refused_before_launch(tmp_path):
    (tmp_path / "a_file").write_text("")
    strategy = DeepSpeedStrategy(
        stage=3, offload_parameters=True, offload_params_device="nvme", nvme_path=str(tmp_path / "a_file" / "swap")
    )
    with pytest.raises(ValueError, match=r"nvme_path='.*a_file/swap' is not writable"):
        resolve(strategy)


def test_the_training_dataloaders_batch_size_fills_the_config_and_a_different_one_is_refused_before_launch():
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from stratagem.demo import DemoModule

    strategy = resolve(DeepSpeedStrategy(stage=2), settings=LoopSettings(accumulate_grad_batches=2))
    strategy.connect_loop_settings(LoopSettings(accumulate_grad_batches=2, train_batch_size=4))
    assert strategy.config["train_micro_batch_size_per_gpu"] == 4
    assert strategy.config["train_batch_size"] == 4 * 2 * 2

    trainer = stratagem.Trainer(
        strategy=DeepSpeedStrategy(config={"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": 8}),
        accelerator="cpu",
        devices=2,
        logger=False,
        enable_progress_bar=False,
    )
    loader = DataLoader(TensorDataset(torch.randn(16, 32), torch.randint(0, 4, (16,))), batch_size=2)
    with pytest.raises(ValueError, match=r"train_micro_batch_size_per_gpu=8, but the training dataloader yields .* 2"):
        trainer.fit(DemoModule(), loader)


def test_a_scheduler_from_configure_optimizers_next_to_one_in_the_config_is_refused_naming_both():
    import torch

    strategy = resolve(DeepSpeedStrategy(config={"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 2}}}))
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    with pytest.raises(ValueError, match=r"StepLR and the DeepSpeed config has a 'scheduler' section \('WarmupLR'\)"):
        strategy.check_lr_schedulers([torch.optim.lr_scheduler.StepLR(optimizer, 1)])
    strategy.check_lr_schedulers([])


def test_a_second_scheduler_is_refused_naming_the_limit():
    import torch

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    schedulers = [torch.optim.lr_scheduler.StepLR(optimizer, 1) for _ in range(2)]
    with pytest.raises(ValueError, match="at most 1 learning-rate scheduler"):
        resolve().check_lr_schedulers(schedulers)


@pytest.mark.parametrize("plugins", ["async", "torch"])
def test_a_checkpoint_io_the_engine_would_bypass_is_refused_at_construction(plugins):
    refusal = r"DeepSpeedStrategy\(stage=3.*\) cannot save through the checkpoint IO \w+: DeepSpeed's engine writes"
    with pytest.raises(ValueError, match=refusal):
        stratagem.Trainer(strategy="deepspeed_stage_3", accelerator="cpu", devices=2, plugins=plugins)


def test_the_deepspeed_checkpoint_io_is_accepted_as_a_plugin():
    strategy = stratagem.resolve(strategy="deepspeed_stage_3", accelerator="cpu", devices=2, plugins="deepspeed")
    assert type(strategy.checkpoint_io).__name__ == "DeepSpeedCheckpointIO"


def test_parallel_options_given_to_deepspeed_reach_parallel_strategy_and_lightnings_go_to_the_config():
    strategy = DeepSpeedStrategy(
        stage=1, timeout=9, start_method="spawn", process_group_backend="gloo", pin_memory=True
    )
    assert (strategy.timeout.total_seconds(), strategy.start_method, strategy.process_group_backend) == (
        9,
        "spawn",
        "gloo",
    )
    assert strategy._lightning.config_values == {"pin_memory": True}
    assert stratagem.registry.strategies.create("deepspeed", timeout=13).timeout.total_seconds() == 13
