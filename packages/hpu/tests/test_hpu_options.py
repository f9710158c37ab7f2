"""hpu_single's options on the stand-in: lazy, eager and compiled execution, HPU graphs for inference, the
precisions Gaudi runs, and the errors for what it cannot."""

from __future__ import annotations

import inspect
import os

import pytest
import torch
from hpu_testing import Classifier, make_loader, trainer
from torch import nn

import stratagem
from stratagem.strategies import ParallelOptions
from stratagem_ddp import DDPStrategy
from stratagem_hpu import HPUParallelStrategy, HPUSingleStrategy
from stratagem_hpu.strategy import DDPOptions


def _calls(habana_calls: list[dict], name: str) -> list[dict]:
    return [call for call in habana_calls if call["call"] == name]


def test_lazy_mode_is_the_default_and_marks_a_step_after_backward_and_after_the_optimizer_step(tmp_path, habana_calls):
    run = trainer(tmp_path)
    run.fit(Classifier(), make_loader(num_samples=32))
    places = [call["place"] for call in _calls(habana_calls, "mark_step")]
    assert places == 4 * ["fit_loop.py:forward_backward", "fit_loop.py:step_optimizers"]
    assert os.environ["PT_HPU_LAZY_MODE"] == "1"


def test_eager_mode_marks_no_step_and_tells_the_bridge_to_run_eagerly(tmp_path, habana_calls):
    run = trainer(tmp_path, strategy=HPUSingleStrategy(execution_mode="eager"))
    run.fit(Classifier(), make_loader(num_samples=32))
    assert _calls(habana_calls, "mark_step") == []
    assert os.environ["PT_HPU_LAZY_MODE"] == "0"


def test_pt_hpu_lazy_mode_0_selects_eager_mode_when_no_mode_is_given():
    os.environ["PT_HPU_LAZY_MODE"] = "0"
    assert HPUSingleStrategy().execution_mode == "eager"


def test_compile_mode_compiles_the_module_with_habanas_backend_and_trains_like_eager(tmp_path, habana_calls):
    eager, compiled = Classifier(), Classifier()
    trainer(tmp_path / "eager", strategy=HPUSingleStrategy(execution_mode="eager")).fit(eager, make_loader(32))
    os.environ.pop("PT_HPU_LAZY_MODE")
    trainer(tmp_path / "compiled", strategy=HPUSingleStrategy(execution_mode="compile")).fit(compiled, make_loader(32))
    assert _calls(habana_calls, "hpu_backend")
    assert _calls(habana_calls, "mark_step") == []
    for (name, first), second in zip(eager.state_dict().items(), compiled.state_dict().values(), strict=True):
        torch.testing.assert_close(first, second, msg=name)


def test_a_mode_that_contradicts_pt_hpu_lazy_mode_is_refused_naming_both(tmp_path):
    os.environ["PT_HPU_LAZY_MODE"] = "0"
    with pytest.raises(ValueError, match=r"execution_mode='lazy' needs PT_HPU_LAZY_MODE=1, but the environment sets"):
        trainer(tmp_path, strategy=HPUSingleStrategy(execution_mode="lazy"))


def test_an_unknown_execution_mode_is_refused_with_the_accepted_ones():
    with pytest.raises(ValueError, match=r"execution_mode='graph' is not valid; expected one of 'lazy', 'eager'"):
        HPUSingleStrategy(execution_mode="graph")  # type: ignore[arg-type]


def test_hpu_graphs_wrap_the_module_for_validate_test_and_predict(tmp_path, habana_calls):
    module = Classifier()
    run = trainer(tmp_path, strategy=HPUSingleStrategy(hpu_graphs=True))
    run.validate(module, make_loader(num_samples=16))
    predictions = run.predict(module, make_loader(num_samples=16))
    assert [call["arguments"]["module"] for call in _calls(habana_calls, "wrap_in_hpu_graph")] == 2 * ["Classifier"]
    assert [len(batch) for batch in predictions] == [8, 8]


@pytest.mark.parametrize("strategy", [HPUSingleStrategy, HPUParallelStrategy])
def test_hpu_graphs_with_fit_is_refused_in_the_calling_process_before_any_process_starts(
    tmp_path, monkeypatch, strategy
):
    run = trainer(tmp_path, strategy=strategy(hpu_graphs=True), devices=1 if strategy is HPUSingleStrategy else 2)
    launched = []
    monkeypatch.setattr(type(run.strategy.launcher), "launch", lambda *arguments, **options: launched.append(1))
    with pytest.raises(ValueError, match=r"hpu_graphs=True replays a recorded inference graph, which cannot train"):
        run.fit(Classifier(), make_loader(num_samples=16))
    assert launched == []


@pytest.mark.parametrize("strategy", [HPUSingleStrategy, HPUParallelStrategy])
def test_an_unknown_option_names_the_hpu_strategy_and_what_it_accepts(strategy):
    with pytest.raises(
        TypeError, match=rf"{strategy.__name__} does not accept option\(s\) 'hpu_graph'\. Accepted: .*hpu_graphs"
    ):
        strategy(hpu_graph=True)


def test_hpu_parallel_takes_every_option_of_ddp_and_its_typed_options_are_ddps():
    own = {
        name
        for name, parameter in inspect.signature(DDPStrategy.__init__).parameters.items()
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY
    }
    assert set(DDPOptions.__annotations__) - set(ParallelOptions.__annotations__) == own
    assert set(inspect.signature(DDPStrategy).parameters) <= set(inspect.signature(HPUParallelStrategy).parameters)
    assert HPUParallelStrategy(static_graph=True, timeout=7, execution_mode="eager").static_graph


def test_bf16_mixed_runs_the_steps_under_bf16_autocast_on_hpu(tmp_path):
    module = Classifier()
    trainer(tmp_path, precision="bf16-mixed").fit(module, make_loader(num_samples=16))
    assert module.seen_autocast == 2 * [(True, torch.bfloat16)]


def test_bf16_true_trains_bf16_parameters(tmp_path):
    module = Classifier()
    trainer(tmp_path, precision="bf16-true").fit(module, make_loader(num_samples=16))
    assert {parameter.dtype for parameter in module.parameters()} == {torch.bfloat16}


def test_fp8_swaps_linear_layers_for_the_engines_and_runs_forward_under_fp8_autocast(tmp_path, habana_calls):
    module = Classifier()
    before = {name: value.clone() for name, value in module.state_dict().items()}
    run = trainer(tmp_path, precision="fp8", max_steps=1)
    run.fit(module, make_loader(num_samples=16))
    engine_layers = [layer for layer in module.modules() if "transformer_engine" in type(layer).__module__]
    assert len(engine_layers) == 2
    assert not any(type(layer) is nn.Linear for layer in module.modules())
    assert len(_calls(habana_calls, "fp8_autocast")) == 1
    assert set(module.state_dict()) == set(before)


def test_fp8_on_a_card_without_it_is_refused_at_construction(tmp_path):
    os.environ["HABANA_STANDIN_FP8"] = "0"
    with pytest.raises(ValueError, match=r"precision='fp8' cannot run here: .*first-generation Gaudi"):
        trainer(tmp_path, precision="fp8")


def test_fp8_on_another_accelerator_is_refused_naming_hpu(tmp_path):
    with pytest.raises(ValueError, match=r"precision='fp8' runs on Gaudi .* Use accelerator='hpu'"):
        trainer(tmp_path, accelerator="cpu", strategy="single_device", precision="fp8")


def test_float64_is_refused_on_gaudi(tmp_path):
    with pytest.raises(ValueError, match=r"precision='64-true' computes in float64, which Gaudi cards do not"):
        trainer(tmp_path, precision="64-true")


def test_an_hpu_strategy_on_another_accelerator_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"HPUSingleStrategy runs on Gaudi cards, but accelerator='cpu'"):
        trainer(tmp_path, accelerator="cpu")


def test_a_checkpoint_from_hpu_single_holds_cpu_tensors_and_loads_under_single_device(tmp_path):
    module = Classifier()
    run = trainer(tmp_path)
    run.fit(module, make_loader(num_samples=16))
    run.save_checkpoint(tmp_path / "model.ckpt")
    checkpoint = torch.load(tmp_path / "model.ckpt", weights_only=True)
    assert {tensor.device.type for tensor in checkpoint["module"].values()} == {"cpu"}
    expected = run.validate(module, make_loader(num_samples=16))
    reference = stratagem.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False)
    got = reference.validate(Classifier(), make_loader(num_samples=16), ckpt_path=str(tmp_path / "model.ckpt"))
    assert got[0]["val_loss"] == pytest.approx(expected[0]["val_loss"], abs=1e-7)
