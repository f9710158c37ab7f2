"""A GPT-style decoder built in configure_model trains under model_parallel exactly as a hand-written torch loop
with the same parallelize_module and fully_shard calls does on the same global batches: tp=2 (2 processes),
dp_shard=2 x tp=2 and dp_replicate=2 x dp_shard=2 (4 processes). A declarative tp_plan= splits like the user's
own plan; layouts that cannot run (tp that does not divide the heads, tp under ddp) are refused, naming sizes."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.utils.data import DataLoader, TensorDataset

import stratagem
from stratagem.mesh import parse_layout
from stratagem.testing import DistributedWorkers
from stratagem_fsdp import ModelParallelStrategy
from stratagem_fsdp.tp_plan import check_plan_matches

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.timeout(240),
    pytest.mark.filterwarnings("ignore:devices=4 starts 4 CPU processes"),
]

VOCAB, WIDTH, HEADS, DEPTH, SEQUENCE = 32, 16, 4, 2, 8
GLOBAL_BATCH, STEPS, LEARNING_RATE = 4, 8, 0.01
LOSS_TOLERANCE = 1e-5

BLOCK_PLAN = {
    "attention.q": "colwise",
    "attention.k": "colwise",
    "attention.v": "colwise",
    "attention.o": "rowwise",
    "mlp.up": "colwise",
    "mlp.down": "rowwise",
}
"""How each block is split: the projections into heads (and the MLP's up) by columns, back out by rows."""

TP_PLAN = {f"model.blocks.*.{name}": style for name, style in BLOCK_PLAN.items()}
"""The same plan for the whole module (its decoder is ``model``), as model_parallel's tp_plan= takes it."""


class Attention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.num_heads, self.head_width = heads, width // heads
        self.q, self.k, self.v, self.o = (nn.Linear(width, width) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        # Under tensor parallelism each rank holds some of the heads: their number follows from the local width.
        q, k, v = (
            projection(x).view(batch, length, -1, self.head_width).transpose(1, 2)
            for projection in (
                self.q,
                self.k,
                self.v,
            )
        )
        mixed = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(mixed.transpose(1, 2).reshape(batch, length, -1))


class MLP(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(nn.functional.gelu(self.up(x)))


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.norm_1, self.norm_2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attention, self.mlp = Attention(width, heads), MLP(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm_1(x))
        return x + self.mlp(self.norm_2(x))


class Decoder(nn.Module):
    def __init__(self, width: int = WIDTH, heads: int = HEADS) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, width)
        self.position = nn.Embedding(SEQUENCE, width)
        self.blocks = nn.ModuleList([Block(width, heads) for _ in range(DEPTH)])
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embedding(tokens) + self.position(torch.arange(tokens.shape[1]))
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h))

    def loss(self, tokens: torch.Tensor) -> torch.Tensor:
        logits = self(tokens[:, :-1])
        return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


class DecoderModule(stratagem.Module):
    """The decoder built in configure_model; ``split_in_configure_model`` applies the user's plan there."""

    def __init__(self, split_in_configure_model: bool = True, heads: int = HEADS, width: int = WIDTH) -> None:
        super().__init__()
        self.split_in_configure_model, self.heads, self.width = split_in_configure_model, heads, width
        self.losses: list[float] = []

    def configure_model(self) -> None:
        torch.manual_seed(0)
        self.model = Decoder(self.width, self.heads)
        if self.split_in_configure_model and self.device_mesh is not None and self.device_mesh["tp"].size() > 1:
            for block in self.model.blocks:
                parallelize_module(block, self.device_mesh["tp"], _styles(BLOCK_PLAN))

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self.model.loss(batch[0])
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=LEARNING_RATE)


def _styles(plan: dict[str, str]) -> dict[str, ColwiseParallel | RowwiseParallel]:
    return {name: ColwiseParallel() if style == "colwise" else RowwiseParallel() for name, style in plan.items()}


def global_batches() -> torch.Tensor:
    """``STEPS`` global batches of token sequences, one after another."""
    return torch.randint(0, VOCAB, (STEPS * GLOBAL_BATCH, SEQUENCE), generator=torch.Generator().manual_seed(7))


def _hand_written_losses(shape: tuple[int, int, int]) -> list[float]:
    """torch alone: the same mesh, parallelize_module per block, fully_shard per block and at the root, and this
    rank's share of each global batch (every data_parallel_size-th sequence, as DistributedSampler deals them)."""
    dp_replicate, dp_shard, tp = shape
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=("dp_replicate", "dp_shard", "tp"))
    torch.manual_seed(0)
    model = Decoder()
    if tp > 1:
        for block in model.blocks:
            parallelize_module(block, mesh["tp"], _styles(BLOCK_PLAN))
    shard_mesh = mesh["dp_replicate", "dp_shard"] if dp_replicate > 1 else mesh["dp_shard"]
    for block in model.blocks:
        fully_shard(block, mesh=shard_mesh)
    fully_shard(model, mesh=shard_mesh, reshard_after_forward=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    data_parallel = dp_replicate * dp_shard
    data_rank = dist.get_rank() // tp
    losses = []
    for batch in global_batches().split(GLOBAL_BATCH):
        loss = model.loss(batch[data_rank::data_parallel])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def _trainer_losses(layout: str, tp_plan: dict[str, str] | None, strategy: str | None = None) -> list[float]:
    """The same training through the Trainer: model_parallel (or the named ``strategy``) with ``layout``, split in
    configure_model or by ``tp_plan``."""
    world = dist.get_world_size()
    sizes = parse_layout(layout).resolved(world)
    module = DecoderModule(split_in_configure_model=tp_plan is None)
    trainer = stratagem.Trainer(
        strategy=strategy or ModelParallelStrategy(auto_wrap_policy={Block}, tp_plan=tp_plan),
        layout=layout,
        accelerator="cpu",
        devices=world,
        max_steps=STEPS,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
    )
    loader = DataLoader(TensorDataset(global_batches()), batch_size=GLOBAL_BATCH // sizes.data_parallel_size)
    trainer.fit(module, loader)
    return module.losses


def _both(
    layout: str, shape: tuple[int, int, int], tp_plan: dict[str, str] | None = None, strategy: str | None = None
) -> dict[str, list[float]]:
    return {"torch": _hand_written_losses(shape), "model_parallel": _trainer_losses(layout, tp_plan, strategy)}


def _refusal_on_every_rank(heads: int, width: int) -> str:
    module = DecoderModule(split_in_configure_model=False, heads=heads, width=width)
    trainer = stratagem.Trainer(
        strategy=ModelParallelStrategy(tp_plan=TP_PLAN),
        layout="tp=2",
        accelerator="cpu",
        devices=dist.get_world_size(),
        max_steps=1,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
    )
    try:
        trainer.fit(module, DataLoader(TensorDataset(global_batches()), batch_size=GLOBAL_BATCH))
    except ValueError as error:
        return str(error)
    return "trained"


def _single_process_losses() -> list[float]:
    torch.manual_seed(0)
    model = Decoder()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    losses = []
    for batch in global_batches().split(GLOBAL_BATCH):
        loss = model.loss(batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def _assert_same_losses(results: list[dict[str, list[float]]], data_parallel: int, tp: int) -> None:
    for rank, result in enumerate(results):
        assert len(result["model_parallel"]) == STEPS, (rank, result)
        assert result["model_parallel"] == pytest.approx(result["torch"], abs=LOSS_TOLERANCE), rank
    # The data-parallel ranks' mean is the global batch's loss: one plain process's.
    means = [sum(step) / data_parallel for step in zip(*(r["model_parallel"] for r in results[::tp]))]
    assert means == pytest.approx(_single_process_losses(), abs=LOSS_TOLERANCE)


@pytest.fixture(scope="module")
def two_workers():
    with DistributedWorkers(2, env={"OMP_NUM_THREADS": "1"}) as pool:
        yield pool


@pytest.fixture(scope="module")
def four_workers():
    with DistributedWorkers(4, env={"OMP_NUM_THREADS": "1"}) as pool:
        yield pool


def test_tp_2_split_in_configure_model_matches_the_hand_written_loop(two_workers):
    _assert_same_losses(two_workers.run(_both, "tp=2", (1, 1, 2)), data_parallel=1, tp=2)


def test_auto_with_a_tp_layout_trains_under_model_parallel_as_the_hand_written_loop(two_workers):
    assert isinstance(stratagem.resolve(layout="tp=2", accelerator="cpu", devices=2), ModelParallelStrategy)
    _assert_same_losses(two_workers.run(_both, "tp=2", (1, 1, 2), None, "auto"), data_parallel=1, tp=2)


def test_dp_shard_2_by_tp_2_split_by_tp_plan_matches_the_hand_written_loop(four_workers):
    results = four_workers.run(_both, "dp_shard=2,tp=2", (1, 2, 2), TP_PLAN)
    _assert_same_losses(results, data_parallel=2, tp=2)


def test_hsdp_2_by_2_matches_the_hand_written_loop(four_workers):
    results = four_workers.run(_both, "dp_replicate=2,dp_shard=2", (2, 2, 1))
    _assert_same_losses(results, data_parallel=4, tp=1)


def test_tp_that_splits_heads_built_in_configure_model_is_refused_on_every_rank_naming_sizes(two_workers):
    outcomes = two_workers.run(_refusal_on_every_rank, 3, 12)
    assert all("tp=2 does not divide the attention heads of 'model.blocks.0.attention'" in o for o in outcomes)
    assert all("num_heads=3" in outcome and "(1, 3)" in outcome for outcome in outcomes), outcomes


def test_declared_heads_that_tp_does_not_divide_are_refused_in_the_calling_process():
    with pytest.raises(ValueError, match=r"tp=4 does not divide num_heads=6.*\(1, 2, 3, 6\)"):
        stratagem.resolve(strategy=ModelParallelStrategy(num_heads=6), layout="tp=4", accelerator="cpu", devices=4)
    with pytest.raises(ValueError, match=r"tp=2 does not divide num_heads=3"):
        stratagem.resolve(strategy=ModelParallelStrategy(tp=2, num_heads=(4, 3)), accelerator="cpu", devices=2)


@pytest.mark.parametrize("strategy", ["ddp", "single_device"])
def test_a_layout_with_tp_under_a_strategy_without_a_mesh_is_refused_naming_the_sizes(strategy):
    devices = 1 if strategy == "single_device" else 2
    with pytest.raises(
        ValueError, match=r"layout=\(pp=1, dp_replicate=1, dp_shard=-1, tp=2\) cannot run under strategy="
    ):
        stratagem.resolve(strategy=strategy, layout="tp=2", accelerator="cpu", devices=devices)


def test_a_layout_given_twice_must_agree():
    with pytest.raises(ValueError, match=r"layout=\(pp=1, dp_replicate=1, dp_shard=1, tp=4\) disagrees .* tp=2"):
        stratagem.resolve(strategy=ModelParallelStrategy(tp=2), layout="dp_shard=1,tp=4", accelerator="cpu", devices=4)


def test_resolve_takes_a_layout_as_text_for_model_parallel():
    strategy = stratagem.resolve(strategy="model_parallel", layout="dp_shard=2,tp=2", accelerator="cpu", devices=4)
    assert strategy.mesh_layout.shape == (1, 1, 2, 2)


def test_an_own_loop_takes_the_layout_as_the_trainer_does():
    runtime = stratagem.Runtime(strategy="model_parallel", layout="dp_shard=2,tp=2", accelerator="cpu", devices=4)
    assert runtime.strategy.mesh_layout.shape == (1, 1, 2, 2)


@pytest.mark.parametrize(
    ("plan", "message"),
    [
        ({"model.blocks.*.attention.q": "diagonal"}, r"tp_plan\['model.blocks.\*.attention.q'\] = 'diagonal' is not"),
        ({"": "colwise"}, r"tp_plan has the key ''"),
        ({}, r"tp_plan=\{\} is not a tensor-parallel plan"),
    ],
)
def test_a_tp_plan_entry_that_is_no_style_is_refused_at_construction_naming_it(plan, message):
    with pytest.raises((ValueError, TypeError), match=message):
        ModelParallelStrategy(tp_plan=plan)


def test_a_tp_plan_pattern_that_matches_no_module_is_refused_before_anything_is_split():
    module = DecoderModule()
    module.configure_model()
    plan = {"model.blocks.*.attention.query": "colwise", "model.blocks.*.mlp.up": "colwise"}
    with pytest.raises(ValueError, match=r"names 'model.blocks.\*.attention.query', which matches no module"):
        check_plan_matches(module, plan)
