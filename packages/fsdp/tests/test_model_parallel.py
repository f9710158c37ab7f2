"""model_parallel on 4 real gloo ranks: (dp_shard=2, tp=2) and (dp_replicate=2, dp_shard=2) compared with one plain
process on the same global batches; the sampler, clipping and checkpoints that single_device reads."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.utils.data import DistributedSampler

import stratagem
from stratagem.testing import DistributedWorkers
from stratagem_fsdp import ModelParallelStrategy

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.timeout(240),
    pytest.mark.filterwarnings("ignore:devices=4 starts 4 CPU processes"),
]

LEARNING_RATE = 0.05
STEPS = 3
GLOBAL_BATCH = 8
CLIP = 0.05
# Measured over these 3 steps: losses differ from one process's by at most 2.4e-7 (HSDP) and 6e-8
# (dp_shard=2 x tp=2), clipped norms by 7e-8 relative: the order of the sharded sums.
LOSS_TOLERANCE = 1e-5


class FeedForward(nn.Module):
    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, hidden)
        self.down = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


class Net(nn.Module):
    def __init__(self, width: int = 8, hidden: int = 12, depth: int = 2) -> None:
        super().__init__()
        self.inp = nn.Linear(5, width)
        self.blocks = nn.ModuleList([FeedForward(width, hidden) for _ in range(depth)])
        self.norm = nn.LayerNorm(width)
        self.out = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.out(self.norm(h))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int = 0) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self(x), y)


def split_feed_forwards(net: Net, tp_mesh) -> None:
    """The user's tensor-parallel plan, as configure_model applies it: each block's up colwise, down rowwise."""
    for block in net.blocks:
        parallelize_module(block, tp_mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})


def global_batches(count: int = STEPS, seed: int = 1234) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(GLOBAL_BATCH, 5, generator=generator), torch.randn(GLOBAL_BATCH, 1, generator=generator))
        for _ in range(count)
    ]


def reference_run(clip: float | None = None) -> tuple[list[float], list[float], dict[str, torch.Tensor]]:
    """The same training in one plain process on whole batches: losses, gradient norms and final weights."""
    torch.manual_seed(0)
    net = Net()
    optimizer = torch.optim.AdamW(net.parameters(), lr=LEARNING_RATE)
    losses, norms = [], []
    for batch in global_batches():
        loss = net.training_step(batch)
        loss.backward()
        if clip is not None:
            norms.append(torch.nn.utils.clip_grad_norm_(net.parameters(), clip).item())
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses, norms, {key: value.detach().clone() for key, value in net.state_dict().items()}


def make_strategy(**options) -> ModelParallelStrategy:
    strategy = stratagem.resolve(strategy=ModelParallelStrategy(**options), accelerator="cpu", devices=4)
    assert isinstance(strategy, ModelParallelStrategy)
    strategy.setup_environment()
    return strategy


def build(strategy: ModelParallelStrategy) -> tuple[Net, torch.optim.Optimizer]:
    """What the Trainer does: create under the init context, let configure_model split, set up."""
    torch.manual_seed(0)
    with strategy.module_init_context():
        net = Net()
    split_feed_forwards(net, strategy.device_mesh["tp"])
    strategy.setup_module(net)
    [optimizer] = strategy.setup_optimizers([torch.optim.AdamW(net.parameters(), lr=LEARNING_RATE)])
    return net, optimizer


def _train(layout: dict, clip: float | None = None, save_to: str | None = None) -> dict:
    strategy = make_strategy(**layout)
    net, optimizer = build(strategy)
    sampler = DistributedSampler(range(GLOBAL_BATCH), shuffle=False, **strategy.distributed_sampler_kwargs)
    indices = list(sampler)
    losses, norms = [], []
    for x, y in global_batches():
        loss = strategy.run_step("training_step", (x[indices], y[indices]))
        strategy.backward(loss, optimizer)
        if clip is not None:
            norms.append(strategy.clip_gradients(optimizer, clip).item())
        strategy.optimizer_step(optimizer)
        strategy.zero_grad(optimizer)
        losses.append(strategy.reduce(loss.detach(), group=strategy.data_parallel_group).item())
    if save_to is not None:
        strategy.save_checkpoint(save_to, {"module": net, "optimizers": [optimizer], "step": STEPS})
    mesh = strategy.device_mesh
    return {
        "losses": losses,
        "norms": norms,
        "indices": indices,
        "coordinates": {
            "dp": dist.get_rank(strategy.data_parallel_group),
            **{name: mesh[name].get_local_rank() for name in ("dp_replicate", "dp_shard", "tp")},
        },
        "split_parameters": sorted(
            name for name, parameter in net.named_parameters() if isinstance(parameter, DTensor)
        ),
        "weights": strategy.module_full_state_dict(),
        "logged_sum": strategy.reduce(torch.tensor(1.0), op="sum", group=strategy.data_parallel_group).item(),
        "rank": dist.get_rank(),
    }


def _initial_weights_with_ranks_seeded_apart() -> dict:
    """Built normally (not on the meta device) with every rank seeded differently, split, set up twice."""
    strategy = make_strategy(dp_shard=2, tp=2)
    torch.manual_seed(dist.get_rank())
    with strategy.module_init_context(empty_init=False):
        net = Net()
    split_feed_forwards(net, strategy.device_mesh["tp"])
    strategy.setup_module(net)
    first = strategy.module_full_state_dict()
    # A second run in the same process (fit, then validate) sets up the sharded module again.
    strategy.setup_module(net)
    return {"first": first, "again": strategy.module_full_state_dict()}


@pytest.fixture(scope="module")
def workers():
    with DistributedWorkers(4, env={"OMP_NUM_THREADS": "1"}) as pool:
        yield pool


@pytest.fixture(scope="module")
def reference():
    return reference_run()


@pytest.fixture(scope="module")
def clipped_reference():
    return reference_run(clip=CLIP)


@pytest.fixture(scope="module")
def dp2_tp2(workers, tmp_path_factory):
    """One (dp_shard=2, tp=2) fit, clipping its gradients, that saves a sharded checkpoint: several checks read it."""
    path = tmp_path_factory.mktemp("dp2_tp2") / "checkpoint"
    return workers.run(_train, {"dp_shard": 2, "tp": 2}, clip=CLIP, save_to=str(path)), path


def _assert_matches(results, reference) -> None:
    losses, _, weights = reference
    for result in results:
        assert result["losses"] == pytest.approx(losses, rel=LOSS_TOLERANCE, abs=LOSS_TOLERANCE)
    trained = results[0]["weights"]
    assert trained.keys() == weights.keys()
    for key, value in weights.items():
        torch.testing.assert_close(trained[key], value, rtol=1e-4, atol=1e-5)


def test_dp_shard_2_by_tp_2_trains_and_clips_like_one_process_on_the_same_global_batch(dp2_tp2, clipped_reference):
    results, _ = dp2_tp2
    _assert_matches(results, clipped_reference)
    assert "blocks.0.up.weight" in results[0]["split_parameters"]
    # Clipping took the norm of the whole gradient, over parameters split on (dp_shard, tp) and on dp_shard alone.
    _, norms, _ = clipped_reference
    for result in results:
        assert result["norms"] == pytest.approx(norms, rel=1e-5)
        assert result["norms"][0] > CLIP


def test_the_sampler_splits_over_data_parallel_ranks_only_and_tp_ranks_see_the_same_batch(dp2_tp2):
    results, _ = dp2_tp2
    by_dp_rank: dict[int, list[int]] = {}
    for result in results:
        by_dp_rank.setdefault(result["coordinates"]["dp"], []).append(result["indices"])
    assert sorted(by_dp_rank) == [0, 1]
    for indices_of_tp_ranks in by_dp_rank.values():
        assert len(indices_of_tp_ranks) == 2
        assert indices_of_tp_ranks[0] == indices_of_tp_ranks[1]
    assert sorted(by_dp_rank[0][0] + by_dp_rank[1][0]) == list(range(GLOBAL_BATCH))
    # Values logged with sync_dist reduce over the data-parallel ranks: a sum counts each batch once.
    assert all(result["logged_sum"] == 2 for result in results)


def test_the_tp_dimension_is_innermost_so_tensor_parallel_ranks_are_neighbours(dp2_tp2):
    results, _ = dp2_tp2
    assert [(r["coordinates"]["dp"], r["coordinates"]["tp"]) for r in results] == [(0, 0), (0, 1), (1, 0), (1, 1)]


def test_a_sharded_dp2_tp2_checkpoint_loads_under_single_device_with_the_trained_weights(dp2_tp2, clipped_reference):
    results, path = dp2_tp2
    assert path.is_dir()
    strategy = stratagem.resolve(strategy="single_device", accelerator="cpu", devices=1)
    strategy.setup_environment()
    net = Net()
    remaining = strategy.load_checkpoint(path, {"module": net})
    assert remaining["step"] == STEPS
    for key, value in results[0]["weights"].items():
        torch.testing.assert_close(net.state_dict()[key], value, rtol=0, atol=0)
    x, y = global_batches(1, seed=7)[0]
    _, _, reference_weights = clipped_reference
    expected = Net()
    expected.load_state_dict(reference_weights)
    assert net.training_step((x, y)).item() == pytest.approx(expected.training_step((x, y)).item(), abs=1e-5)


def test_hsdp_dp_replicate_2_by_dp_shard_2_trains_like_one_process(workers, reference):
    results = workers.run(_train, {"dp_replicate": 2, "dp_shard": 2, "tp": 1})
    _assert_matches(results, reference)
    assert sorted(result["coordinates"]["dp"] for result in results) == [0, 1, 2, 3]
    assert all(result["logged_sum"] == 4 for result in results)


def test_split_layers_built_on_ranks_seeded_apart_start_from_rank_zeros_weights(workers):
    [result, *_] = workers.run(_initial_weights_with_ranks_seeded_apart)
    torch.manual_seed(0)
    expected = Net().state_dict()
    for name, value in expected.items():
        assert torch.equal(result["first"][name], value), name
        assert torch.equal(result["again"][name], value), name


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"dp_shard": 3, "tp": 2}, r"dp_replicate=1, dp_shard=3, tp=2.*multiply to 6, not to the 4 processes"),
        ({"tp": 3}, r"multiply to 3, which does not divide the 4 processes"),
        ({"dp_shard": -1, "tp": "auto"}, r"dp_shard=-1 and tp=-1: at most one"),
        ({"tp": 0}, r"tp=0 is not a valid mesh size"),
        ({"dp_shard": 2, "data_parallel_size": 2}, r"both dp_shard=2 and data_parallel_size=2"),
        ({"sharding_strategy": "HYBRID_SHARD"}, r"sharding_strategy=.*dp_replicate= and dp_shard="),
    ],
)
def test_a_layout_that_cannot_fit_is_refused_in_the_calling_process_naming_the_sizes(options, message):
    with pytest.raises((ValueError, TypeError), match=message):
        stratagem.resolve(strategy=ModelParallelStrategy(**options), accelerator="cpu", devices=4)


def test_lightning_spellings_and_defaults_give_the_same_layouts():
    by_name = stratagem.resolve(strategy="model_parallel", accelerator="cpu", devices=4)
    assert by_name.mesh_layout.shape == (1, 1, 1, 4)  # Lightning's "auto": tensor parallel within the node
    lightning = ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=2)
    stratagem.resolve(strategy=lightning, accelerator="cpu", devices=4)
    assert lightning.mesh_layout.shape == (1, 1, 2, 2)
    assert lightning.distributed_sampler_kwargs == {"num_replicas": 2, "rank": 0}
    full = ModelParallelStrategy(tp=2, save_distributed_checkpoint=False)
    assert full.state_dict_type == "full"


def test_a_module_outside_a_run_has_no_device_mesh():
    assert stratagem.Module().device_mesh is None
