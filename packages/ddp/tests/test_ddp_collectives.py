"""Collectives, DDP wrapping and comm hooks on 2 real gloo ranks, all on one reused pool of workers."""

import gc

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, post_localSGD_hook, powerSGD_hook

import stratagem
from stratagem.checkpoint_io import TorchCheckpointIO
from stratagem.demo import DemoModule, demo_dataloaders
from stratagem.strategies._backend_threads import _GLOO_THREAD_NAMES, _thread_names
from stratagem.testing import DistributedWorkers
from stratagem_ddp import DDPStrategy

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def workers():
    with DistributedWorkers(2) as pool:
        yield pool


def _strategy(**options):
    """A DDPStrategy joined to the pool's process group (which it finds already initialised)."""
    strategy = stratagem.resolve(strategy=DDPStrategy(**options), accelerator="cpu", devices=2)
    strategy.setup_environment()
    return strategy


def _reductions():
    strategy = _strategy()
    value = torch.tensor([strategy.global_rank + 1.0])
    return {op: strategy.reduce(value, op=op).item() for op in ("sum", "mean", "max", "min")} | {
        "integer_mean": strategy.reduce(torch.tensor([strategy.global_rank * 3]), op="mean").item(),
        "input_untouched": value.item() == strategy.global_rank + 1.0,
        "all_true": strategy.reduce_boolean(True),
        "all_of_mixed": strategy.reduce_boolean(strategy.global_rank == 0),
        "any_of_mixed": strategy.reduce_boolean(strategy.global_rank == 0, all_ranks=False),
    }


def test_reduce_sums_averages_and_takes_extremes_over_ranks(workers):
    expected = {"sum": 3.0, "mean": 1.5, "max": 2.0, "min": 1.0, "integer_mean": 1, "input_untouched": True}
    expected |= {"all_true": True, "all_of_mixed": False, "any_of_mixed": True}
    assert workers.run(_reductions) == [expected, expected]


def _mesh_of_ddp():
    strategy = _strategy()
    module = strategy.setup_module(nn.Linear(2, 2))
    mesh = strategy.device_mesh
    return {
        "layout": str(strategy.mesh_layout),
        "dimensions": mesh.mesh_dim_names,
        "shape": tuple(mesh.shape),
        "replicas_group_is_ddps": module.process_group is mesh["dp_replicate"].get_group(),
        "data_ranks": dist.get_world_size(strategy.data_parallel_group),
        "sampler": strategy.distributed_sampler_kwargs,
    }


def test_ddp_is_the_dp_replicate_layout_of_core_mesh_for_wrapping_sampling_and_reducing(workers):
    results = workers.run(_mesh_of_ddp)
    for rank, result in enumerate(results):
        assert result == {
            "layout": "pp=1, dp_replicate=2, dp_shard=1, tp=1",
            "dimensions": ("pp", "dp_replicate", "dp_shard", "tp"),
            "shape": (1, 2, 1, 1),
            "replicas_group_is_ddps": True,
            "data_ranks": 2,
            "sampler": {"num_replicas": 2, "rank": rank},
        }


def _gloo_threads() -> int:
    names = _thread_names()
    assert names is not None
    return sum(name in _GLOO_THREAD_NAMES for name in names.values())


def _threads_after_runs(runs):
    counts = []
    for _ in range(runs):
        strategy = _strategy()
        module = strategy.setup_module(nn.Linear(2, 2))
        module(torch.ones(1, 2)).sum().backward()
        counts.append(_gloo_threads())
    return counts


@pytest.mark.skipif(_thread_names() is None, reason="counts threads through /proc")
def test_runs_in_one_process_reuse_the_mesh_so_gloo_threads_do_not_grow_with_each_run(workers):
    for counts in workers.run(_threads_after_runs, 12):
        assert counts[1:] == counts[:1] * 11, counts


def _gather():
    strategy = _strategy()
    rank = strategy.global_rank
    gathered = strategy.all_gather(torch.full((2, 3), float(rank)))
    x = torch.tensor(rank + 1.0, requires_grad=True)
    differentiable = strategy.all_gather(x, sync_grads=True)
    (differentiable * torch.tensor([1.0, 2.0])).sum().backward()
    return gathered.tolist(), differentiable.tolist(), x.grad.item()


def test_all_gather_stacks_every_rank_and_sync_grads_sends_gradients_back(workers):
    (gathered0, values0, grad0), (gathered1, values1, grad1) = workers.run(_gather)
    assert gathered0 == gathered1 == [[[0.0] * 3] * 2, [[1.0] * 3] * 2]
    assert values0 == values1 == [1.0, 2.0]
    # Every rank's loss weighs rank r's value by r + 1, so its gradient is world_size * (r + 1).
    assert (grad0, grad1) == (2.0, 4.0)


def _broadcast_and_barrier():
    strategy = _strategy()
    rank = strategy.global_rank
    tensor = strategy.broadcast(torch.tensor([10.0 + rank]), src=1)
    obj = strategy.broadcast({"from": rank, "items": [rank] * 3})
    strategy.barrier()
    strategy.barrier("named")
    return tensor.item(), obj


def test_broadcast_sends_tensors_and_objects_from_the_source_rank(workers):
    assert workers.run(_broadcast_and_barrier) == [(11.0, {"from": 0, "items": [0, 0, 0]})] * 2


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))


def _batch():
    generator = torch.Generator().manual_seed(1)
    return torch.randn(8, 4, generator=generator), torch.randn(8, 1, generator=generator)


def _gradients(**options):
    """Gradients of this rank's half of the batch through DDP, next to those of the whole batch in one process."""
    strategy = _strategy(**options)
    x, y = _batch()
    reference = _model()
    nn.functional.mse_loss(reference(x), y).backward()
    model = strategy.setup_module(_model())
    half = slice(4 * strategy.global_rank, 4 * strategy.global_rank + 4)
    strategy.backward(nn.functional.mse_loss(model(x[half]), y[half]), None)
    return [(p.grad.clone(), r.grad) for p, r in zip(strategy.module.parameters(), reference.parameters())]


def test_ddp_gradients_equal_the_whole_batch_gradient_of_one_process(workers):
    for rank_result in workers.run(_gradients):
        for ddp_grad, full_grad in rank_result:
            torch.testing.assert_close(ddp_grad, full_grad)


def test_fp16_compress_hook_averages_gradients_on_gloo(workers):
    for rank_result in workers.run(_gradients, ddp_comm_hook=default_hooks.fp16_compress_hook):
        for ddp_grad, full_grad in rank_result:
            torch.testing.assert_close(ddp_grad, full_grad, atol=1e-3, rtol=1e-3)


def _skipped_sync():
    strategy = _strategy()
    model = strategy.setup_module(_model())
    x = torch.full((2, 4), float(strategy.global_rank))
    with strategy.no_backward_sync(True):
        strategy.backward(model(x).sum(), None)
    local = [p.grad.clone() for p in strategy.module.parameters()]
    strategy.backward(model(x).sum(), None)
    synced = [p.grad.clone() for p in strategy.module.parameters()]
    return local, synced


def test_no_backward_sync_keeps_gradients_local_until_the_next_synced_backward(workers):
    (local0, synced0), (local1, synced1) = workers.run(_skipped_sync)
    assert any(not torch.equal(a, b) for a, b in zip(local0, local1))
    for a, b, l0, l1 in zip(synced0, synced1, local0, local1):
        torch.testing.assert_close(a, b)
        # Each rank accumulated its local gradient twice; the synced backward averages those sums.
        torch.testing.assert_close(a, l0 + l1)


def _train(steps, data_per_rank=True, step_through_strategy=True, **options):
    """Train a few SGD steps through the strategy (or with the optimizer's own ``step``, as the loops call it where
    the strategy's is the base one); return every parameter after each step."""
    strategy = _strategy(**options)
    model = strategy.setup_module(_model())
    optimizer = strategy.setup_optimizers([torch.optim.SGD(model.parameters(), lr=0.1)])[0]
    generator = torch.Generator().manual_seed(strategy.global_rank if data_per_rank else 0)
    history = []
    for _ in range(steps):
        loss = model(torch.randn(4, 4, generator=generator)).pow(2).mean()
        strategy.backward(loss, optimizer)
        if step_through_strategy:
            strategy.optimizer_step(optimizer)
        else:
            optimizer.step()
        strategy.zero_grad(optimizer)
        history.append(torch.cat([p.detach().flatten() for p in strategy.module.parameters()]))
    # Not strategy.teardown(): the pool's process group must outlive this check. The wrapper
    # and its hook state go now, while the group exists (see DDPStrategy.teardown).
    del model, strategy
    gc.collect()
    return history


def _ranks_agree(results, step):
    return torch.equal(results[0][step], results[1][step])


def test_power_sgd_with_one_bucket_trains_in_step_on_gloo(workers):
    state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=2)
    options = {"ddp_comm_hook": powerSGD_hook.powerSGD_hook, "ddp_comm_state": state, "bucket_cap_mb": 1000}
    results = workers.run(_train, 5, **options)
    assert all(_ranks_agree(results, step) for step in range(5))


def local_sgd_state():
    subgroup, _ = dist.new_subgroups(group_size=1)
    return post_localSGD_hook.PostLocalSGDState(process_group=None, subgroup=subgroup, start_localSGD_iter=2)


@pytest.mark.parametrize("step_through_strategy", [True, False], ids=["strategy_step", "optimizer_step"])
def test_post_local_sgd_diverges_between_averaging_steps_and_agrees_on_them(workers, step_through_strategy):
    results = workers.run(
        _train,
        5,
        step_through_strategy=step_through_strategy,
        ddp_comm_hook=post_localSGD_hook.post_localSGD_hook,
        ddp_comm_state=local_sgd_state,
        model_averaging_period=2,
    )
    # Steps 1-2 all-reduce gradients; from step 3 on each rank steps alone and the models are
    # averaged on every second step (3, 5).
    assert [_ranks_agree(results, step) for step in range(5)] == [True, True, True, False, True]


def test_static_graph_trains_in_step(workers):
    results = workers.run(_train, 3, static_graph=True)
    assert all(_ranks_agree(results, step) for step in range(3))


class _SkipsABranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.used = nn.Linear(4, 1)
        self.unused = nn.Linear(4, 1)

    def forward(self, x):
        return self.used(x)


def _train_with_unused_parameters():
    strategy = stratagem.resolve(strategy="ddp_find_unused_parameters_true", accelerator="cpu", devices=2)
    strategy.setup_environment()
    model = strategy.setup_module(_SkipsABranch())
    for _ in range(2):
        strategy.backward(model(torch.randn(2, 4)).sum(), None)
    return strategy.module.unused.weight.grad is None


def test_find_unused_parameters_variant_trains_a_module_that_skips_parameters(workers):
    assert workers.run(_train_with_unused_parameters) == [True, True]


def _fit_in_the_pools_group():
    from stratagem.strategies import parallel

    group = dist.group.WORLD
    trainer = stratagem.Trainer(
        strategy="ddp", accelerator="cpu", devices=2, max_steps=2, logger=False, enable_progress_bar=False,
        enable_checkpointing=False, num_sanity_val_steps=0,
    )  # fmt: skip
    train_loader, _ = demo_dataloaders(batch_size=8, num_samples=64)
    waits = []
    wait = parallel.wait_for_idle_gloo_workers
    parallel.wait_for_idle_gloo_workers = lambda: waits.append(wait())
    try:
        trainer.fit(DemoModule(hidden=8), train_loader)
    finally:
        parallel.wait_for_idle_gloo_workers = wait
    ranks = torch.ones(1)
    dist.all_reduce(ranks)
    return dist.is_initialized() and dist.group.WORLD is group, ranks.item(), waits


def test_a_process_group_the_user_created_survives_the_trainer_which_still_waits_for_its_collectives(workers):
    # The wait keeps the run's last collectives from aborting the process at exit (see _backend_threads).
    assert workers.run(_fit_in_the_pools_group) == [(True, 2.0, [True]), (True, 2.0, [True])]


class _GatheringCheckpointIO(TorchCheckpointIO):
    """A collective IO: every rank calls it, and rank 0 writes which ranks did beside the state."""

    writes_collectively = True

    def save_checkpoint(self, checkpoint, path):
        callers = [None] * dist.get_world_size()
        dist.all_gather_object(callers, dist.get_rank())
        if dist.get_rank() == 0:
            super().save_checkpoint({**checkpoint, "callers": callers}, path)


class _RankRecordingCheckpointIO(TorchCheckpointIO):
    def save_checkpoint(self, checkpoint, path):
        super().save_checkpoint({**checkpoint, "caller": dist.get_rank()}, path)


class _FailingCheckpointIO(TorchCheckpointIO):
    def save_checkpoint(self, checkpoint, path):
        raise OSError("disk full")


def _save_through(checkpoint_io, path):
    strategy = stratagem.resolve(strategy=DDPStrategy(), accelerator="cpu", devices=2, plugins=checkpoint_io)
    strategy.setup_environment()
    strategy.setup_module(_model())
    try:
        strategy.save_checkpoint(path, {"module": strategy.module, "step": 3})
    except (RuntimeError, OSError) as error:
        return f"{type(error).__name__}: {error}"
    finally:
        strategy.teardown()
    # Every rank returns only once the checkpoint is there.
    return sorted(torch.load(path, weights_only=True).keys() - {"module"})


def test_a_collective_checkpoint_io_is_called_by_every_rank_and_a_rank_0_one_by_rank_0_alone(workers, tmp_path):
    collective, alone = tmp_path / "collective.ckpt", tmp_path / "alone.ckpt"
    assert workers.run(_save_through, _GatheringCheckpointIO(), collective) == [["callers", "step"]] * 2
    assert torch.load(collective, weights_only=True)["callers"] == [0, 1]
    assert workers.run(_save_through, _RankRecordingCheckpointIO(), alone) == [["caller", "step"]] * 2
    assert torch.load(alone, weights_only=True)["caller"] == 0


def test_a_write_failing_on_rank_0_fails_on_every_rank_naming_it_and_leaves_no_file(workers, tmp_path):
    failed = tmp_path / "failed.ckpt"
    rank_0, rank_1 = workers.run(_save_through, _FailingCheckpointIO(), failed)
    assert rank_0 == "OSError: disk full"
    assert rank_1 == f"RuntimeError: save_checkpoint({str(failed)!r}) failed on rank 0: OSError: disk full"
    assert not failed.exists()
