"""A tiny GPT-style decoder, its data, and the hand-written torch.distributed.pipelining loop the pipeline
strategy is compared with."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional

import stratagem

VOCAB = 32
WIDTH = 16
SEQUENCE = 8
DEPTH = 4
GLOBAL_BATCH = 8
STEPS = 8
LEARNING_RATE = 0.01


class Block(nn.Module):
    """Pre-norm causal self-attention and an MLP, each added to the residual stream."""

    def __init__(self, width: int = WIDTH, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.attention_norm = nn.LayerNorm(width)
        # No bias: the keys' bias has no gradient but rounding noise, which Adam would turn into steps of lr.
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.projection = nn.Linear(width, width)
        self.mlp_norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(self.attention_norm(x)).split(width, dim=-1)
        q, k, v = (t.view(batch, length, self.heads, width // self.heads).transpose(1, 2) for t in (q, k, v))
        attended = functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.projection(attended.transpose(1, 2).reshape(batch, length, width))
        return x + self.down(functional.gelu(self.up(self.mlp_norm(x))))


class _DecoderSteps(stratagem.Module):
    """The loss, steps and optimizer of the decoders here: next-token cross entropy, AdamW."""

    def pipeline_loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return functional.cross_entropy(logits.flatten(0, 1), targets.flatten())

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int = 0) -> torch.Tensor:
        tokens, targets = batch
        return self.pipeline_loss(self(tokens), targets)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int = 0) -> None:
        tokens, targets = batch
        self.log("val_loss", self.pipeline_loss(self(tokens), targets), sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=LEARNING_RATE)


class TinyGPT(_DecoderSteps):
    """Token and position embeddings, ``DEPTH`` blocks, a final norm and the head.

    ``forward`` skips the pieces a pipeline stage does not hold (``None``), as the pipeline needs.
    """

    def __init__(self, depth: int = DEPTH) -> None:
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, WIDTH)
        self.positions = nn.Embedding(SEQUENCE, WIDTH)
        self.layers = nn.ModuleList(Block() for _ in range(depth))
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tokens is not None:
            x = self.tokens(x) + self.positions(torch.arange(x.shape[1], device=x.device))
        for layer in self.layers:
            x = layer(x)
        if self.norm is not None:
            x = self.head(self.norm(x))
        return x


class HuggingFaceGPT2(_DecoderSteps):
    """A transformers ``GPT2LMHeadModel`` from a config (no download), of the same size as :class:`TinyGPT`.

    Its embeddings (``gpt.transformer.wte``, ``wpe``, ``drop``) go to the first stage, ``gpt.transformer.h`` is
    the block list, ``ln_f`` and ``lm_head`` go to the last. Its own ``forward`` builds the attention mask for the
    whole model; this one runs the pieces a stage holds (the blocks' attention is causal without a mask). The
    head's weight is its own: GPT-2 ties it to the token embedding, which would be a weight on two stages.
    """

    def __init__(self) -> None:
        super().__init__()
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(
            vocab_size=VOCAB, n_positions=SEQUENCE, n_embd=WIDTH, n_layer=DEPTH, n_head=2, bos_token_id=0,
            eos_token_id=0, tie_word_embeddings=False, attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0,
        )  # fmt: skip
        self.gpt = GPT2LMHeadModel(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        body = self.gpt.transformer
        if body.wte is not None:
            x = body.drop(body.wte(x) + body.wpe(torch.arange(x.shape[1], device=x.device)))
        for block in body.h:
            x = block(x)
        if body.ln_f is not None:
            x = self.gpt.lm_head(body.ln_f(x))
        return x


def global_batches(count: int = STEPS, seed: int = 1234) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(count):
        tokens = torch.randint(0, VOCAB, (GLOBAL_BATCH, SEQUENCE + 1), generator=generator)
        batches.append((tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()))
    return batches


def single_process_losses(
    seed: int = 0, accumulate: int = 1, clip: float | None = None, build: type[_DecoderSteps] = TinyGPT
) -> tuple[list[float], dict[str, torch.Tensor]]:
    """The same training in one plain process on whole batches: losses (per optimizer step, the mean of its
    batches') and final weights. Accumulating, each batch's loss is divided by ``accumulate``, as the Trainer
    does, also in a last window cut short; ``clip`` clips the gradient's norm before each step; ``build`` is the
    model's class."""
    torch.manual_seed(seed)
    model = build()
    optimizer = model.configure_optimizers()
    losses = []
    batches = global_batches()
    for start in range(0, len(batches), accumulate):
        window = [model.training_step(batch) for batch in batches[start : start + accumulate]]
        (sum(window) / accumulate).backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(sum(loss.item() for loss in window) / len(window))
    return losses, {name: value.detach().clone() for name, value in model.state_dict().items()}


class _HandStage(nn.Module):
    """One stage of the decoder, written out by hand: the blocks ``first..last`` with the ends they need."""

    def __init__(self, model: TinyGPT, blocks: range) -> None:
        super().__init__()
        self.embed = blocks.start == 0
        self.finish = blocks.stop == len(model.layers)
        self.tokens, self.positions = (model.tokens, model.positions) if self.embed else (None, None)
        self.blocks = nn.ModuleList(model.layers[index] for index in blocks)
        self.norm, self.head = (model.norm, model.head) if self.finish else (None, None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed:
            x = self.tokens(x) + self.positions(torch.arange(x.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)) if self.finish else x


def hand_written_pipeline(schedule_name: str, micro_batches: int, stages_per_rank: int = 1, seed: int = 0) -> list:
    """torch.distributed.pipelining used directly: every rank builds the model as one process does (same seed),
    keeps its stages by hand (looped: rank r holds stages r, r + pp, ...) and trains on the global batches."""
    from torch.distributed.pipelining import PipelineStage, schedules

    torch.manual_seed(seed)
    model = TinyGPT()
    pp, rank = dist.get_world_size(), dist.get_rank()
    num_stages = pp * stages_per_rank
    per_stage = DEPTH // num_stages
    own = [rank + round_ * pp for round_ in range(stages_per_rank)]
    modules = [_HandStage(model, range(stage * per_stage, (stage + 1) * per_stage)) for stage in own]
    stages = [PipelineStage(module, stage, num_stages, torch.device("cpu")) for module, stage in zip(modules, own)]
    schedule_class = getattr(schedules, schedule_name)
    schedule = schedule_class(
        stages if stages_per_rank > 1 else stages[0], n_microbatches=micro_batches, loss_fn=model.pipeline_loss
    )
    parameters = [parameter for module in modules for parameter in module.parameters()]
    optimizer = torch.optim.AdamW(parameters, lr=LEARNING_RATE)
    return _train_through(schedule, optimizer, last_stage_rank=(num_stages - 1) % pp)


TP_PLAN = {"layers.*.up": "colwise", "layers.*.down": "rowwise"}
"""The decoder's MLPs split over the ``"tp"`` ranks (its attention, whose ``qkv`` is split by width, stays whole)."""


def hand_written_pipeline_with_tp(schedule_name: str, micro_batches: int, seed: int = 0) -> list:
    """pp=2 x tp=2 by hand on 4 ranks: each rank builds the model as one process does, keeps its stage, splits
    its blocks' MLPs over its tp pair with ``parallelize_module``, and trains through the schedule on the pp group."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.pipelining import PipelineStage, schedules
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.manual_seed(seed)
    model = TinyGPT()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "tp"))
    stage, pp_group = mesh["pp"].get_local_rank(), mesh["pp"].get_group()
    per_stage = DEPTH // 2
    module = _HandStage(model, range(stage * per_stage, (stage + 1) * per_stage))
    for block in module.blocks:
        parallelize_module(block, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
    pipeline_stage = PipelineStage(module, stage, 2, torch.device("cpu"), group=pp_group)
    schedule = getattr(schedules, schedule_name)(
        pipeline_stage, n_microbatches=micro_batches, loss_fn=model.pipeline_loss
    )
    optimizer = torch.optim.AdamW(module.parameters(), lr=LEARNING_RATE)
    return _train_through(schedule, optimizer, last_stage_rank=dist.get_global_rank(pp_group, 1), group=pp_group)


def _train_through(schedule: Any, optimizer: torch.optim.Optimizer, last_stage_rank: int, group: Any = None) -> list:
    """Step ``schedule`` over the global batches; each step's mean loss, sent from the last stage to ``group``."""
    losses = []
    for tokens, targets in global_batches():
        step_losses: list[torch.Tensor] = []
        schedule.step(tokens, target=targets, losses=step_losses)
        optimizer.step()
        optimizer.zero_grad()
        loss = torch.stack(step_losses).mean() if step_losses else torch.zeros(())
        dist.broadcast(loss, src=last_stage_rank, group=group)
        losses.append(loss.item())
    return losses
