import pytest
import torch
from torch import nn

import stratagem
from stratagem.cli.main import main
from stratagem.planning import Resources, model_footprint, plan
from stratagem.planning.auto import CHOICE_VARIABLE, choose_strategy
from stratagem.strategies import MemoryEstimate, SingleDeviceStrategy

GIB = 1024**3
PLENTY = Resources(host_memory_bytes=1000 * GIB, device_memory_bytes=None, disk_bytes=1000 * GIB)


class Blocks(stratagem.Module):
    """Built in configure_model, as a model too big to create whole would be."""

    def __init__(self, width: int = 64, depth: int = 3, optimizer: str = "adamw", example: bool = True) -> None:
        super().__init__()
        self.width, self.depth, self.optimizer = width, depth, optimizer
        self.blocks: nn.Sequential | None = None
        if example:
            self.example_input_array = torch.zeros(5, width)

    def configure_model(self) -> None:
        if self.blocks is None:
            self.blocks = nn.Sequential(*[nn.Linear(self.width, self.width) for _ in range(self.depth)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert self.blocks is not None
        return self.blocks(x)

    def training_step(self, batch, batch_idx):
        return self(batch[0]).sum()

    def configure_optimizers(self):
        if self.optimizer == "sgd":
            return torch.optim.SGD(self.parameters(), lr=0.1)
        if self.optimizer == "sgd_momentum":
            return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
        return torch.optim.AdamW(self.parameters())


class HalvingStrategy(SingleDeviceStrategy):
    """Declares that it holds half of what a replicated strategy holds, at twice the step time."""

    def estimate_memory(self, footprint):
        whole = super().estimate_memory(footprint)
        return MemoryEstimate(device_bytes=whole.device_bytes // 2, relative_step_time=2.0)


def _elements(width, depth):
    return depth * (width * width + width)


def test_footprint_counts_parameters_gradients_and_adamw_state_without_touching_the_module():
    module = Blocks(width=64, depth=3)
    footprint, notes = model_footprint(module)
    elements = _elements(64, 3)
    assert footprint.parameters == elements
    assert footprint.parameter_bytes == footprint.gradient_bytes == 4 * elements
    assert footprint.optimizer_state_bytes == 2 * 4 * elements
    assert footprint.largest_unit_bytes == 4 * (64 * 64 + 64)
    assert module.blocks is None  # the meta copy ran configure_model, not the user's module
    assert notes == []


@pytest.mark.parametrize(("optimizer", "states"), [("sgd", 0), ("sgd_momentum", 1), ("adamw", 2)])
def test_footprint_sizes_optimizer_state_by_the_optimizer_the_module_configures(optimizer, states):
    footprint, _ = model_footprint(Blocks(optimizer=optimizer))
    assert footprint.optimizer_state_bytes == states * footprint.gradient_bytes


def test_footprint_counts_the_outputs_of_a_meta_forward_of_example_input_array():
    footprint, _ = model_footprint(Blocks(width=64, depth=3))
    assert footprint.activation_bytes == 3 * 5 * 64 * 4


def test_footprint_without_example_input_says_activations_are_not_counted():
    footprint, notes = model_footprint(Blocks(example=False))
    assert footprint.activation_bytes == 0
    assert any("example_input_array" in note for note in notes)


def test_footprint_in_bf16_true_halves_every_byte_count():
    from stratagem import registry

    footprint, _ = model_footprint(Blocks(width=64, depth=3), registry.precisions.create("bf16-true"))
    assert footprint.parameter_bytes == 2 * _elements(64, 3)
    assert footprint.optimizer_state_bytes == 2 * 2 * _elements(64, 3)


def test_a_module_built_in_init_is_measured_from_its_existing_parameters():
    class Built(stratagem.Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(10, 10)

    module = Built()
    footprint, _ = model_footprint(module)
    assert footprint.parameters == 110
    assert module.layer.weight.device.type == "cpu"


def test_the_default_estimate_holds_the_whole_training_state_and_activations():
    strategy = stratagem.resolve(accelerator="cpu", strategy="single_device", devices=1)
    footprint, _ = model_footprint(Blocks())
    estimate = strategy.estimate_memory(footprint)
    assert estimate.device_bytes == footprint.training_state_bytes + footprint.activation_bytes
    assert (estimate.host_bytes, estimate.disk_bytes, estimate.relative_step_time) == (0, 0, 1.0)


def test_plan_prefers_the_faster_strategy_when_both_fit():
    result = plan(Blocks(), ["single_device", HalvingStrategy()], accelerator="cpu", devices=1, resources=PLENTY)
    assert [candidate.fits for candidate in result.candidates] == [True, True]
    assert result.chosen is result.candidates[0]
    assert result.reason().startswith("auto → single_device: ")


def test_plan_chooses_the_strategy_that_fits_when_the_default_does_not_and_says_why():
    footprint, _ = model_footprint(Blocks())
    whole = footprint.training_state_bytes + footprint.activation_bytes
    tight = Resources(host_memory_bytes=int(whole * 0.7), device_memory_bytes=None, disk_bytes=GIB)
    result = plan(Blocks(), ["single_device", HalvingStrategy()], accelerator="cpu", devices=1, resources=tight)
    first, halving = result.candidates
    assert not first.fits
    assert "host memory" in (first.problem or "")
    assert halving.fits
    assert result.chosen is halving
    assert result.reason().startswith("auto → HalvingStrategy: ")
    assert "single_device would need" in result.reason()


def test_plan_says_no_strategy_fits_and_names_the_smallest():
    nothing = Resources(host_memory_bytes=1, device_memory_bytes=None, disk_bytes=1)
    result = plan(Blocks(), ["single_device", HalvingStrategy()], accelerator="cpu", devices=1, resources=nothing)
    assert result.chosen is None
    assert "the smallest, HalvingStrategy," in result.reason()


def test_plan_lists_a_strategy_that_cannot_run_here_with_its_reason():
    result = plan(Blocks(), ["single_device", "no_such_strategy"], accelerator="cpu", devices=1, resources=PLENTY)
    assert result.candidates[1].estimate is None
    assert "not usable here" in (result.candidates[1].problem or "")


def test_auto_takes_the_choice_the_calling_process_handed_its_workers(monkeypatch):
    monkeypatch.setenv(CHOICE_VARIABLE, "single_device")
    assert choose_strategy(Blocks(), {"accelerator": "cpu", "devices": 1}, "single_device") == ("single_device", None)


class BuiltInInit(stratagem.Module):
    """A small model built in ``__init__``; records whether its optimizer was built."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.layer = nn.Linear(width, width)
        self.optimizers_built = 0

    def configure_optimizers(self):
        self.optimizers_built += 1
        return torch.optim.AdamW(self.parameters())


def test_auto_keeps_the_default_for_a_trivially_small_built_model_without_planning_it():
    module = BuiltInInit()
    name, reason = choose_strategy(module, {"accelerator": "cpu", "devices": 2}, "ddp", device=torch.device("cpu"))
    assert name == "ddp"
    assert reason == "auto → ddp: the model's 288 bytes of tensors fit any strategy"
    assert module.optimizers_built == 0


def test_auto_plans_a_small_model_when_memory_is_too_tight_to_call_it_trivial(monkeypatch):
    tight = Resources(host_memory_bytes=288 * 1000, device_memory_bytes=None, disk_bytes=GIB)
    monkeypatch.setattr("stratagem.planning.planner.visible_resources", lambda *_: tight)
    name, reason = choose_strategy(
        BuiltInInit(), {"accelerator": "cpu", "devices": 1}, "single_device", device=torch.device("cpu")
    )
    assert name == "single_device"
    assert reason is not None
    assert "fit any strategy" not in reason


def test_auto_plans_a_model_built_in_configure_model_however_small():
    name, reason = choose_strategy(
        Blocks(width=4, depth=1), {"accelerator": "cpu", "devices": 1}, "single_device", device=torch.device("cpu")
    )
    assert name == "single_device"
    assert reason is not None
    assert "fit any strategy" not in reason


def test_trainer_auto_keeps_the_usual_strategy_saying_so_in_one_summary_line_when_the_model_fits(tmp_path, capsys):
    module = Blocks(width=8, depth=2)
    data = [(torch.zeros(4, 8),) for _ in range(2)]
    trainer = stratagem.Trainer(
        accelerator="cpu", devices=1, max_steps=1, default_root_dir=tmp_path, logger=False, enable_progress_bar=False
    )
    trainer.fit(module, data)
    [kept] = [line for line in capsys.readouterr().err.splitlines() if "auto →" in line]
    assert kept.startswith("stratagem: auto → single_device: ")
    assert type(trainer.strategy).__name__ == "SingleDeviceStrategy"
    assert trainer.global_step == 1


def test_trainer_auto_refuses_a_model_nothing_fits_before_anything_starts(tmp_path, monkeypatch):
    nothing = Resources(host_memory_bytes=1, device_memory_bytes=None, disk_bytes=1)
    monkeypatch.setattr("stratagem.planning.planner.visible_resources", lambda *_: nothing)
    trainer = stratagem.Trainer(accelerator="cpu", devices=1, max_steps=1, default_root_dir=tmp_path, logger=False)
    with pytest.raises(ValueError, match="strategy='auto' found no strategy to train Blocks"):
        trainer.fit(Blocks(), [(torch.zeros(4, 64),)])


def test_plan_command_prints_every_strategy_and_the_choice(tmp_path, capsys):
    source = tmp_path / "model.py"
    source.write_text(
        "import torch\nfrom torch import nn\n"
        "class Net(nn.Module):\n"
        "    def __init__(self, width=16):\n        super().__init__()\n        self.layer = nn.Linear(width, width)\n"
    )
    assert (
        main(["plan", f"{source}:Net", "--init-args", '{"width": 32}', "--accelerator", "cpu", "--devices", "1"]) == 0
    )
    output = capsys.readouterr().out
    assert "model: 1,056 parameters" in output
    assert any(line.startswith("single_device ") and line.endswith("yes") for line in output.splitlines())
    assert output.rstrip().splitlines()[-1].startswith("auto → single_device: ")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["plan", "nocolon"], "expected package.module:Class"),
        (["plan", "missing_file.py:Net"], "missing_file.py is not a file"),
        (["plan", "torch.nn:Nope"], "torch.nn has no attribute 'Nope'"),
        (["plan", "torch.nn:Linear", "--init-args", "[1]"], "expected a JSON object"),
        (["plan", "torch.nn:Linear", "--init-args", '{"in_features": 1e400}'], "1e400 is beyond what a float holds"),
        (["plan", "torch.nn:Linear", "--init-args", '{"a": ' + "[" * 10_000 + "]" * 10_000 + "}"], "nested too deeply"),
    ],
    ids=["no colon", "missing file", "no class", "not an object", "overflowing number", "nested 10000 deep"],
)
def test_plan_command_names_a_bad_argument(capsys, argv, message):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_auto_keeps_the_usual_strategy_when_the_model_cannot_be_copied_to_measure_it():
    import threading

    module = Blocks()
    module.lock = threading.Lock()  # deepcopy refuses locks
    name, reason = choose_strategy(module, {"accelerator": "cpu", "devices": 1}, "single_device")
    assert name == "single_device"
    assert "the model could not be measured (TypeError" in (reason or "")


def test_plan_counts_what_each_process_holds_before_the_model_against_the_memory():
    footprint, _ = model_footprint(Blocks())
    need = footprint.training_state_bytes + footprint.activation_bytes
    room = int(need / 0.85) + 1024
    bare = Resources(host_memory_bytes=room, device_memory_bytes=None, disk_bytes=GIB)
    loaded = Resources(host_memory_bytes=room, device_memory_bytes=None, disk_bytes=GIB, process_bytes=need)
    assert plan(Blocks(), ["single_device"], accelerator="cpu", devices=1, resources=bare).chosen is not None
    assert plan(Blocks(), ["single_device"], accelerator="cpu", devices=1, resources=loaded).chosen is None


def test_plan_output_keeps_to_100_columns_with_one_line_per_reason_a_strategy_is_unusable():
    from stratagem.cli.plan import WIDTH, render
    from stratagem.planning.planner import Candidate, Plan

    def missing(name):
        return Candidate(
            name,
            problem=f"not usable here: The strategy {name!r} (from stratagem-hpu) needs the module "
            "habana_frameworks, which is not installed: install Intel Gaudi's software stack.",
        )

    estimate = MemoryEstimate(device_bytes=GIB, host_bytes=0, disk_bytes=0, relative_step_time=1.0)
    hpu = [f"hpu_deepspeed_stage_{stage}_offload_with_a_long_name" for stage in range(1, 4)]
    result = Plan(
        footprint=model_footprint(Blocks())[0],
        resources=PLENTY,
        candidates=[
            Candidate("ddp", estimate=estimate),
            *map(missing, hpu),
            Candidate("dp", problem="not usable here: strategy='dp' needs CUDA GPUs, but accelerator='cpu'."),
        ],
        notes=["x" * 300],
    )
    lines = render(result).splitlines()
    assert max(map(len, lines)) <= WIDTH
    text = " ".join(line.strip() for line in lines)
    assert text.count("needs the module habana_frameworks") == 1
    assert f"{', '.join(hpu)}: The strategy <name> (from stratagem-hpu)" in text
    assert "- dp: strategy='dp' needs CUDA GPUs" in text
    assert "not usable here (4):" in text
    assert any(line.startswith("ddp ") and line.endswith("yes") for line in lines)


def test_plan_command_json_keeps_every_detail(tmp_path, capsys):
    import json

    source = tmp_path / "model.py"
    source.write_text(
        "from torch import nn\nclass Net(nn.Linear):\n    def __init__(self):\n        super().__init__(4, 4)\n"
    )
    assert main(["plan", f"{source}:Net", "--accelerator", "cpu", "--devices", "1", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["footprint"]["parameters"] == 20
    assert result["chosen"] == "single_device"
    [single] = [candidate for candidate in result["candidates"] if candidate["name"] == "single_device"]
    assert single["fits"]
    assert single["estimate"]["relative_step_time"] == 1.0
    assert all(candidate["fits"] or candidate["problem"] for candidate in result["candidates"])
