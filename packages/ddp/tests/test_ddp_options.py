"""Options and combinations that cannot work are refused in the calling process, before any rank starts."""

import socket

import pytest
import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, post_localSGD_hook, powerSGD_hook

import stratagem
from stratagem.accelerators.cpu import CPUAccelerator
from stratagem.environments import LocalEnvironment
from stratagem.precision import Precision
from stratagem.registry import precisions
from stratagem_ddp import DataParallelStrategy, DDPStrategy


def _resolve(**options):
    return stratagem.resolve(strategy=DDPStrategy(**options), accelerator="cpu", devices=2)


def _power_sgd_state():
    return powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=1)


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"start_method": "threads"}, ValueError, r"start_method='threads' is not valid; expected one of 'popen'"),
        ({"find_unused_parameters": "yes"}, TypeError, r"find_unused_parameters='yes' is not valid; expected True"),
        ({"static_graph": 1}, TypeError, r"static_graph=1 is not valid"),
        ({"bucket_cap_mb": 0}, ValueError, r"bucket_cap_mb=0 is not valid; expected a positive number"),
        ({"model_averaging_period": 0}, ValueError, r"model_averaging_period=0 is not valid"),
        ({"ddp_comm_hook": "fp16"}, TypeError, r"ddp_comm_hook='fp16' is not valid; expected a function"),
        ({"timeout": -5}, ValueError, r"timeout=-5 is not valid; expected a positive number of seconds"),
        ({"timeout": "abc"}, TypeError, r"timeout='abc' \(str\) is not valid"),
        ({"process_group_backend": "glo"}, ValueError, r"process_group_backend='glo' is not valid: .*Known: gloo"),
    ],
)
def test_invalid_option_values_name_the_option_and_what_is_accepted(options, error, message):
    with pytest.raises(error, match=message):
        DDPStrategy(**options)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"ddp_comm_hook": default_hooks.bf16_compress_hook}, r"ddp_comm_hook=bf16_compress_hook needs NCCL 2.10\+"),
        (
            {"ddp_comm_hook": default_hooks.allreduce_hook, "ddp_comm_wrapper": default_hooks.bf16_compress_wrapper},
            r"ddp_comm_wrapper=bf16_compress_wrapper needs NCCL 2.10\+ with CUDA, but process_group_backend='gloo'",
        ),
        (
            {"ddp_comm_hook": powerSGD_hook.powerSGD_hook, "ddp_comm_state": _power_sgd_state()},
            r"powerSGD_hook on process_group_backend='gloo' needs every gradient in one bucket.*bucket_cap_mb=1000",
        ),
        (
            {"ddp_comm_hook": powerSGD_hook.batched_powerSGD_hook, "ddp_comm_state": _power_sgd_state()},
            r"batched_powerSGD_hook fails on process_group_backend='gloo'",
        ),
        (
            {
                "ddp_comm_hook": post_localSGD_hook.post_localSGD_hook,
                "ddp_comm_state": post_localSGD_hook.PostLocalSGDState(None, None, start_localSGD_iter=2),
                "model_averaging_period": 2,
            },
            r"PostLocalSGDState\(subgroup=None, \.\.\.\) makes one subgroup per machine sized by the CUDA device count",
        ),
        (
            {"ddp_comm_hook": post_localSGD_hook.post_localSGD_hook, "ddp_comm_state": lambda: None},
            r"post_localSGD_hook needs model_averaging_period",
        ),
        ({"model_averaging_period": 4}, r"model_averaging_period=4 only applies with a ddp_comm_hook"),
        (
            {"ddp_comm_hook": default_hooks.fp16_compress_hook, "model_averaging_period": 4},
            r"model_averaging_period=4 is for ddp_comm_hook=post_localSGD_hook, but ddp_comm_hook=fp16_compress_hook",
        ),
        ({"ddp_comm_wrapper": default_hooks.fp16_compress_wrapper}, r"ddp_comm_wrapper=.* only applies with a"),
    ],
)
def test_comm_hook_combinations_that_fail_on_gloo_are_refused_before_launch(options, message):
    with pytest.raises(ValueError, match=message):
        _resolve(**options)


def test_comm_hooks_that_work_on_gloo_are_accepted():
    _resolve(ddp_comm_hook=default_hooks.fp16_compress_hook)
    _resolve(ddp_comm_hook=powerSGD_hook.powerSGD_hook, ddp_comm_state=_power_sgd_state(), bucket_cap_mb=1000)
    _resolve(
        ddp_comm_hook=post_localSGD_hook.post_localSGD_hook,
        ddp_comm_state=lambda: post_localSGD_hook.PostLocalSGDState(None, None, 2),
        model_averaging_period=2,
    )


def test_static_graph_with_gradient_accumulation_is_refused_at_trainer_construction():
    with pytest.raises(ValueError, match=r"accumulate_grad_batches=2 .* not support with static_graph=True"):
        stratagem.Trainer(
            strategy=DDPStrategy(static_graph=True), accelerator="cpu", devices=2, accumulate_grad_batches=2
        )


@pytest.mark.parametrize("name", ["ddp", "ddp_spawn"])
def test_master_port_in_use_is_refused_before_any_rank_starts(monkeypatch, name):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        monkeypatch.setenv("MASTER_PORT", str(busy.getsockname()[1]))
        strategy = stratagem.resolve(strategy=name, accelerator="cpu", devices=2)
        with pytest.raises(ValueError, match=r"MASTER_PORT=\d+ is already in use"):
            strategy.launcher.launch(print)


def test_dp_is_refused_on_cpu_with_what_to_use_instead():
    with pytest.raises(ValueError, match=r"strategy='dp' .* several CUDA GPUs .* accelerator='cpu'.*strategy='ddp'"):
        stratagem.resolve(strategy="dp", accelerator="cpu", devices=2)


class _StandInCUDA(CPUAccelerator):
    """Only what DataParallelStrategy.configure reads: the device type. No GPU here."""

    device_type = "cuda"


@pytest.mark.parametrize("precision", ["16-mixed", "bf16-mixed", "16-true", "bf16-true"])
def test_dp_is_refused_with_16_bit_precision(precision):
    strategy = DataParallelStrategy()
    with pytest.raises(ValueError, match=rf"strategy='dp' does not support precision='{precision}'"):
        strategy.configure(
            accelerator=_StandInCUDA(),
            devices=[torch.device("cuda", 0), torch.device("cuda", 1)],
            num_nodes=1,
            precision=precisions.create(precision),
            checkpoint_io=None,
            cluster_environment=LocalEnvironment(),
        )


def test_dp_accepts_32_bit_precision_on_cuda_devices():
    strategy = DataParallelStrategy()
    strategy.configure(
        accelerator=_StandInCUDA(),
        devices=[torch.device("cuda", 0), torch.device("cuda", 1)],
        num_nodes=1,
        precision=Precision(),
        checkpoint_io=None,
        cluster_environment=LocalEnvironment(),
    )
    assert strategy.root_device == torch.device("cuda", 0)


def test_parallel_options_given_to_ddp_reach_parallel_strategy():
    strategy = DDPStrategy(find_unused_parameters=True, timeout=9, process_group_backend="gloo", start_method="spawn")
    assert strategy.find_unused_parameters
    assert (strategy.timeout.total_seconds(), strategy.process_group_backend, strategy.start_method) == (
        9,
        "gloo",
        "spawn",
    )


def test_the_registry_checks_ddp_options_against_its_own_and_the_parallel_ones():
    from stratagem import registry

    assert registry.strategies.create("ddp_spawn", timeout=11).timeout.total_seconds() == 11
    with pytest.raises(TypeError, match=r"does not accept option\(s\) 'timout'\. Accepted: .*find_unused_parameters"):
        registry.strategies.create("ddp", timout=11)


def test_an_unknown_ddp_option_lists_the_accepted_ones():
    with pytest.raises(TypeError, match=r"DDPStrategy does not accept option\(s\) 'bucket_cap'\. Accepted: .*timeout"):
        DDPStrategy(bucket_cap=25)


def test_lightnings_precision_plugin_is_refused_by_ddp_naming_precision():
    with pytest.raises(TypeError, match=r"DDPStrategy\(precision_plugin=\.\.\.\) is Lightning's name; .*precision="):
        DDPStrategy(precision_plugin=Precision())


def test_dp_takes_the_options_of_every_strategy_without_re_declaring_them():
    from stratagem import registry

    strategy = registry.strategies.create("dp", precision=Precision(), parallel_devices=[torch.device("cuda", 0)])
    assert strategy.precision.name == "32-true"
    with pytest.raises(TypeError, match=r"accept option\(s\) 'devices'\. Accepted: accelerator, checkpoint_io"):
        registry.strategies.create("dp", devices=2)
    with pytest.raises(TypeError, match=r"DataParallelStrategy\(precision_plugin=\.\.\.\) is Lightning's name"):
        DataParallelStrategy(precision_plugin=Precision())
