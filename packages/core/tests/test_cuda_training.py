"""On one CUDA GPU: exact resume under 16-mixed (with its loss scaler), bf16-mixed and bf16-true, compile with
inductor as eager trains, manual optimization with the scaler, and the peak memory the CUDA allocator counts."""

from __future__ import annotations

import pytest
import torch
from test_compile import Block, data, fresh, make_trainer
from test_manual_optimization import TwoOptimizers
from test_resume_exact import TOTAL_STEPS, _fit
from trainer_testing import assert_bitwise_equal, make_loader, parameters_of, quiet_trainer

from stratagem.testing import requires_cuda

pytestmark = [*requires_cuda(), pytest.mark.timeout(300)]

CUDA = {"accelerator": "cuda", "devices": 1, "deterministic": True}


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({"precision": "16-mixed", "gradient_clip_val": 0.5}, id="16-mixed-with-scaler-and-clipping"),
        pytest.param({"precision": "bf16-mixed"}, id="bf16-mixed"),
        pytest.param({"precision": "bf16-true"}, id="bf16-true"),
    ],
)
def test_resuming_on_cuda_matches_an_uninterrupted_run_bitwise(tmp_path, options):
    whole_trainer, whole = _fit(tmp_path / "whole", TOTAL_STEPS, **CUDA, **options)
    _fit(tmp_path / "parts", 11, **CUDA, **options)
    resumed_trainer, resumed = _fit(tmp_path / "parts", TOTAL_STEPS, ckpt_path="last", module_seed=1, **CUDA, **options)
    assert resumed_trainer.global_step == TOTAL_STEPS
    assert next(resumed.parameters()).device.type == "cuda"
    assert_bitwise_equal(parameters_of(resumed), parameters_of(whole))
    if options["precision"] == "16-mixed":
        scaler = whole_trainer.strategy.precision.scaler
        assert scaler is not None
        assert scaler.is_enabled()
        assert resumed_trainer.strategy.precision.scaler.get_scale() == scaler.get_scale()
    if options["precision"] == "bf16-true":
        assert next(resumed.parameters()).dtype == torch.bfloat16


def test_inductor_on_cuda_trains_as_eager_does(tmp_path):
    eager = fresh()
    eager_trainer = make_trainer(tmp_path / "eager", accelerator="cuda", enable_checkpointing=False)
    eager_trainer.fit(eager, data())
    compiled = fresh()
    trainer = make_trainer(
        tmp_path / "compiled", accelerator="cuda", enable_checkpointing=False, compile={"blocks": Block}
    )
    trainer.fit(compiled, data())
    assert float(trainer.callback_metrics["train_loss"]) == pytest.approx(
        float(eager_trainer.callback_metrics["train_loss"]), rel=1e-3
    )
    for name, value in eager.state_dict().items():
        torch.testing.assert_close(compiled.state_dict()[name], value, atol=1e-4, rtol=1e-3, msg=name)


def test_manual_optimization_steps_both_optimizers_through_the_16_mixed_scaler_on_cuda(tmp_path):
    module = TwoOptimizers()
    trainer = quiet_trainer(tmp_path, accelerator="cuda", precision="16-mixed", max_steps=8)
    trainer.fit(module, make_loader())
    assert trainer.global_step == 8
    assert torch.isfinite(trainer.callback_metrics["loss"])
    assert trainer.strategy.precision.scaler.get_scale() > 0


def test_the_peak_memory_is_the_cuda_allocators(tmp_path):
    trainer = quiet_trainer(tmp_path, accelerator="cuda", max_steps=2)
    trainer.fit(TwoOptimizers(), make_loader())
    [peak] = trainer.throughput.peak_memory_bytes
    assert 0 < peak <= torch.cuda.max_memory_reserved()
