"""A small GPT-style decoder trained with tensor parallelism composed with fully_shard, then read by single_device.

    python examples/model_parallel.py                          # tp=2 on two CPU processes
    python examples/model_parallel.py --devices 4 --dp-shard 2 --tp 2

``configure_model`` splits each block's attention and MLP over ``self.device_mesh["tp"]`` (the plan is
the user's, as in Lightning's ModelParallelStrategy); the strategy then applies ``fully_shard`` over the
``"dp_shard"`` ranks. The sharded checkpoint it writes is validated under ``single_device``, where
``self.device_mesh`` is ``None`` and the model stays whole. Needs stratagem-fsdp.
"""

import argparse

import torch
from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.utils.data import DataLoader, TensorDataset

import stratagem
from stratagem import Trainer
from stratagem_fsdp import ModelParallelStrategy

VOCABULARY, CONTEXT, WIDTH, HEADS = 32, 16, 64, 4


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention_norm = nn.LayerNorm(WIDTH)
        self.q, self.k, self.v, self.o = (nn.Linear(WIDTH, WIDTH) for _ in range(4))
        self.mlp_norm = nn.LayerNorm(WIDTH)
        self.up, self.down = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        h = self.attention_norm(x)
        # -1 heads: under tensor parallelism each rank holds HEADS / tp of them.
        q, k, v = (
            projection(h).view(batch, length, -1, WIDTH // HEADS).transpose(1, 2)
            for projection in (self.q, self.k, self.v)
        )
        attended = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(attended.transpose(1, 2).reshape(batch, length, -1))
        return x + self.down(nn.functional.gelu(self.up(self.mlp_norm(x))))


class Decoder(nn.Module):
    def __init__(self, depth: int = 2) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCABULARY, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(depth))
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCABULARY)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embedding(tokens)
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h))


# The tensor-parallel plan of one block: projections into heads / the MLP's width split by columns, back by rows.
BLOCK_PLAN = {
    "q": ColwiseParallel(),
    "k": ColwiseParallel(),
    "v": ColwiseParallel(),
    "o": RowwiseParallel(),
    "up": ColwiseParallel(),
    "down": RowwiseParallel(),
}


class LanguageModel(stratagem.Module):
    def __init__(self) -> None:
        super().__init__()
        self.model: Decoder | None = None

    def configure_model(self) -> None:
        if self.model is not None:
            return
        self.model = Decoder()
        if self.device_mesh is not None:
            for block in self.model.blocks:
                parallelize_module(block, self.device_mesh["tp"], BLOCK_PLAN)

    def _loss(self, tokens: torch.Tensor) -> torch.Tensor:
        logits = self.model(tokens[:, :-1])
        return nn.functional.cross_entropy(logits.reshape(-1, VOCABULARY), tokens[:, 1:].reshape(-1))

    def training_step(self, batch, batch_idx):
        loss = self._loss(batch[0])
        self.log("train_loss", loss, prog_bar=True, sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self._loss(batch[0]), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=3e-3)


def sequences(count: int, seed: int) -> TensorDataset:
    """Counting sequences from random starts: the next token is always learnable."""
    starts = torch.randint(0, VOCABULARY, (count, 1), generator=torch.Generator().manual_seed(seed))
    return TensorDataset((starts + torch.arange(CONTEXT + 1)) % VOCABULARY)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--dp-shard", type=int, default=-1, help="-1: the ranks tp leaves")
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--max-steps", type=int, default=20)
    parser.add_argument("--root-dir", default="stratagem_model_parallel")
    args = parser.parse_args()

    # A layout that does not fit the devices fails here, in this process, before anything starts.
    strategy = ModelParallelStrategy(dp_shard=args.dp_shard, tp=args.tp)
    trainer = Trainer(
        strategy=strategy,
        accelerator="cpu",
        devices=args.devices,
        max_steps=args.max_steps,
        default_root_dir=args.root_dir,
        seed=0,
    )
    train = DataLoader(sequences(512, seed=0), batch_size=16, shuffle=True)
    validation = DataLoader(sequences(64, seed=1), batch_size=16)
    trainer.fit(LanguageModel(), train, validation)
    if not trainer.is_global_zero:
        return
    checkpoint = trainer.checkpoint_callback.best_model_path
    print(f"{strategy.mesh_layout}: train loss {float(trainer.callback_metrics['train_loss']):.4f}")
    print(f"sharded checkpoint: {checkpoint}")
    whole = Trainer(strategy="single_device", accelerator="cpu", devices=1, logger=False)
    [metrics] = whole.validate(LanguageModel(), validation, ckpt_path=checkpoint)
    print(f"single_device reads it: val loss {metrics['val_loss']:.4f}")


if __name__ == "__main__":
    main()
