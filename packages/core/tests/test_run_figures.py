"""Run figures: ThroughputMonitor's samples, tokens and FLOPs per second and MFU, each rank's peak memory in
``trainer.throughput``, and the model summary printed when fitting starts."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from trainer_testing import ClassifierModule, make_loader, quiet_trainer

import stratagem
from stratagem.callbacks import ModelSummary, ThroughputMonitor, measure_flops
from stratagem.callbacks.model_summary import summary_lines
from stratagem.callbacks.throughput_monitor import first_dimension
from stratagem.loggers import Logger


class KeepMetrics(Logger):
    def __init__(self) -> None:
        self.rows: list[tuple[int, dict[str, float]]] = []

    def log_metrics(self, metrics, step):
        self.rows.append((step, dict(metrics)))


def test_throughput_monitor_logs_samples_tokens_flops_mfu_and_peak_memory_every_n_steps(tmp_path):
    logger = KeepMetrics()
    monitor = ThroughputMonitor(tokens_fn=lambda batch: batch[0].numel(), flops_per_batch=1e6, peak_flops=1e9)
    trainer = quiet_trainer(tmp_path, max_steps=6, logger=logger, log_every_n_steps=2, callbacks=[monitor])
    trainer.fit(ClassifierModule(), make_loader(batch_size=8))
    logged = [(step, row) for step, row in logger.rows if "throughput/samples_per_sec" in row]
    assert [step for step, _ in logged] == [2, 4, 6]
    for _, row in logged:
        # Batches of 8 samples with 8 features each: every ratio is exact, whatever the speed.
        assert row["throughput/samples_per_sec"] == pytest.approx(8 * row["throughput/batches_per_sec"])
        assert row["throughput/tokens_per_sec"] == pytest.approx(64 * row["throughput/batches_per_sec"])
        assert row["throughput/flops_per_sec"] == pytest.approx(1e6 * row["throughput/batches_per_sec"])
        assert row["throughput/mfu"] == pytest.approx(row["throughput/flops_per_sec"] / 1e9)
        assert row["memory/peak_mib/rank0"] > 10  # a process with torch holds far more than 10 MiB
    assert monitor.run_figures["throughput/samples_per_sec"] == pytest.approx(
        8 * monitor.run_figures["throughput/batches_per_sec"]
    )


def test_each_ranks_peak_memory_is_in_the_trainers_throughput(tmp_path):
    trainer = quiet_trainer(tmp_path, max_steps=2)
    trainer.fit(ClassifierModule(), make_loader())
    [peak] = trainer.throughput.peak_memory_bytes
    assert peak is not None
    assert peak > 10 * 2**20
    assert trainer.throughput.max_peak_memory_bytes == peak


def test_the_samples_of_a_batch_are_its_first_tensors_first_dimension_and_else_named():
    assert first_dimension((torch.zeros(5, 3), torch.zeros(5))) == 5
    assert first_dimension({"ids": [torch.zeros(2, 7)]}) == 2
    with pytest.raises(TypeError, match="pass batch_size_fn="):
        first_dimension(["text only"])


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"peak_flops": 1e12}, "needs flops_per_batch too"),
        ({"flops_per_batch": -1}, r"flops_per_batch=-1\) is not valid; expected a number > 0"),
        ({"log_every_n_steps": 0}, r"log_every_n_steps=0\) is not valid"),
        ({"tokens_fn": 3}, r"tokens_fn=3\) is not valid; expected a function of the batch"),
    ],
)
def test_throughput_monitor_refuses_options_it_cannot_use(options, message):
    with pytest.raises((ValueError, TypeError), match=message):
        ThroughputMonitor(**options)


def test_measure_flops_counts_a_linear_layers_forward_and_backward():
    layer = nn.Linear(16, 32, device="meta")
    inputs = torch.empty(4, 16, device="meta")
    assert measure_flops(lambda: layer(inputs)) == 2 * 4 * 16 * 32
    # Backward adds one product: the weight's gradient (the input needs none).
    assert measure_flops(lambda: layer(inputs).sum().backward()) == 2 * 2 * 4 * 16 * 32


class Blocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(256, 256) for _ in range(8))

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters())


def test_the_summary_names_parameters_and_what_each_rank_holds_under_the_strategy():
    module = Blocks()
    module.blocks[0].requires_grad_(False)  # frozen: counted, not trainable
    single = stratagem.resolve(strategy="single_device", accelerator="cpu", devices=1)
    whole = summary_lines(module, single)
    assert whole[0] == "stratagem: Blocks: 526,336 parameters (460,544 trainable), 2.0 MiB of weights"
    assert "SingleDeviceStrategy, 1 process: each rank holds about" in whole[1]
    assert whole[1].endswith("(planner's estimate; 100% of one unsplit copy)")
    fsdp = pytest.importorskip("stratagem_fsdp", reason="the sharded share needs stratagem-fsdp")
    sharded = stratagem.resolve(strategy=fsdp.FSDPStrategy(auto_wrap_policy={nn.Linear}), accelerator="cpu", devices=2)
    split = summary_lines(module, sharded)
    assert "FSDPStrategy, 2 processes: each rank holds about" in split[1]
    assert int(split[1].split("; ")[-1].split("%")[0]) < 100


def test_fit_prints_the_summary_and_autos_kept_choice_once_and_not_when_disabled(tmp_path, capsys):
    stratagem.Trainer(
        accelerator="cpu", devices=1, max_steps=1, default_root_dir=tmp_path, logger=False, enable_progress_bar=False
    ).fit(ClassifierModule(), make_loader())
    err = capsys.readouterr().err.splitlines()
    assert [line.split(":")[1].strip() for line in err if line.startswith("stratagem: ")][:2] == [
        "ClassifierModule",
        "SingleDeviceStrategy, 1 process",
    ]
    assert len([line for line in err if line.startswith("stratagem: auto → single_device: ")]) == 1
    quiet_trainer(tmp_path, max_steps=1, enable_model_summary=False).fit(ClassifierModule(), make_loader())
    assert "parameters" not in capsys.readouterr().err
    with pytest.raises(ValueError, match="contains a ModelSummary but enable_model_summary=False"):
        quiet_trainer(tmp_path, callbacks=[ModelSummary()], enable_model_summary=False)


def test_a_module_that_cannot_be_measured_is_named_and_still_trained(tmp_path):
    class Unmeasurable(ClassifierModule):
        def __deepcopy__(self, memo):
            raise RuntimeError("holds a handle that cannot be copied")

    single = stratagem.resolve(strategy="single_device", accelerator="cpu", devices=1)
    [line] = summary_lines(Unmeasurable(), single)
    assert line == (
        "stratagem: Unmeasurable could not be measured (RuntimeError: holds a handle that cannot be copied)"
    )
