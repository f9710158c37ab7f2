"""A GAN-style module with two optimizers and manual optimization trains alike under single_device, ddp and fsdp
on the same global batch, and each resumes to bitwise the weights of its uninterrupted run."""

from __future__ import annotations

import pytest
import torch
from manual_optimization_runs import BATCHES, GLOBAL_BATCH, STEPS, fit_and_resume

from stratagem.testing import DistributedWorkers, WorkerError

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(240)]

WORKER_ENV = {"TORCHELASTIC_RUN_ID": "stratagem-manual-optimization", "GROUP_RANK": "0", "OMP_NUM_THREADS": "1"}
# ddp's reducer must see the parameters a toggled backward leaves out as unused (as in Lightning).
PARALLEL_STRATEGIES = ("ddp_find_unused_parameters_true", "fsdp")


@pytest.fixture(scope="module")
def single_device(tmp_path_factory):
    return fit_and_resume("single_device", 1, str(tmp_path_factory.mktemp("single_device")))


@pytest.fixture(scope="module")
def parallel_runs(tmp_path_factory):
    with DistributedWorkers(2, env=WORKER_ENV) as pair:
        runs = {
            name: pair.run(fit_and_resume, name, 2, str(tmp_path_factory.mktemp(name)), timeout=200)
            for name in PARALLEL_STRATEGIES
        }
        # Last: a failed run ends the pair.
        with pytest.raises(WorkerError) as plain_ddp:
            pair.run(fit_and_resume, "ddp", 2, str(tmp_path_factory.mktemp("ddp")), timeout=200)
        runs["ddp"] = str(plain_ddp.value)
        return runs


def _assert_bitwise(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> None:
    assert first.keys() == second.keys()
    for name in first:
        assert torch.equal(first[name], second[name]), name


def test_single_device_trains_both_optimizers_and_resumes_exactly(single_device):
    assert single_device["global_step"] == single_device["resumed_global_step"] == STEPS
    assert len(single_device["losses"]) == BATCHES
    _assert_bitwise(single_device["resumed_weights"], single_device["weights"])


@pytest.mark.parametrize("strategy", PARALLEL_STRATEGIES)
def test_two_processes_train_as_single_device_and_resume_exactly(parallel_runs, single_device, strategy):
    rank_0, rank_1 = parallel_runs[strategy]
    assert rank_0["global_step"] == rank_0["resumed_global_step"] == STEPS
    # Each rank's loss is over its half of the global batch: their mean is single_device's loss.
    mean_losses = torch.tensor([rank_0["losses"], rank_1["losses"]]).mean(dim=0)
    torch.testing.assert_close(mean_losses, torch.tensor(single_device["losses"]), rtol=1e-5, atol=1e-6)
    for name, expected in single_device["weights"].items():
        torch.testing.assert_close(rank_0["weights"][name], expected, rtol=1e-5, atol=1e-6, msg=name)
        torch.testing.assert_close(rank_1["weights"][name], expected, rtol=1e-5, atol=1e-6, msg=name)
    _assert_bitwise(rank_0["resumed_weights"], rank_0["weights"])
    _assert_bitwise(rank_1["resumed_weights"], rank_1["weights"])


@pytest.mark.parametrize("strategy", PARALLEL_STRATEGIES)
def test_the_run_figures_count_both_ranks_samples_and_each_ranks_peak_memory(parallel_runs, strategy):
    for rank in parallel_runs[strategy]:
        figures = rank["figures"]
        # Each rank trains on half the global batch per batch: both halves count.
        assert figures["throughput/samples_per_sec"] == pytest.approx(
            GLOBAL_BATCH * figures["throughput/batches_per_sec"]
        )
        peaks = rank["peak_memory_bytes"]
        assert len(peaks) == 2
        assert all(peak > 10 * 2**20 for peak in peaks)
        assert [figures[f"memory/peak_mib/rank{index}"] > 10 for index in (0, 1)] == [True, True]


def test_plain_ddp_names_the_strategy_that_finds_the_parameters_a_toggled_backward_leaves_out(parallel_runs):
    assert "left some parameters without a gradient" in parallel_runs["ddp"]
    assert "strategy='ddp_find_unused_parameters_true'" in parallel_runs["ddp"]
