"""A Llama-3-style decoder built from a config (no weights), with a tensor-parallel plan: what ``stratagem plan``
sizes clusters for (``stratagem plan stratagem.demo.llama:LlamaModule --init-args '{"size": "8b"}' ...``).

The architecture follows Meta's published Llama 3 configurations (RMSNorm, rotary positions, grouped-query
attention, a SwiGLU MLP, untied input and output embeddings), so that its parameter counts are theirs: 8.03B
for ``"8b"`` and 70.6B for ``"70b"``. The plan splits what torchtitan's Llama plan splits (the embeddings by
vocabulary, attention by heads, the MLP by width) over ``self.device_mesh["tp"]``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from stratagem.module import Module


@dataclass(frozen=True)
class LlamaConfig:
    dim: int
    layers: int
    heads: int
    kv_heads: int
    ffn_dim: int
    vocab: int = 128_256
    context: int = 8192
    rope_theta: float = 500_000.0


SIZES = {
    # Meta's Llama 3 8B and 70B (config.json of Meta-Llama-3-8B / -70B).
    "8b": LlamaConfig(dim=4096, layers=32, heads=32, kv_heads=8, ffn_dim=14336),
    "70b": LlamaConfig(dim=8192, layers=80, heads=64, kv_heads=8, ffn_dim=28672),
    "tiny": LlamaConfig(dim=64, layers=2, heads=8, kv_heads=4, ffn_dim=128, vocab=256, context=32),
}


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _rotated(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    first, second = x[..., ::2], x[..., 1::2]
    return torch.stack((first * cos - second * sin, first * sin + second * cos), dim=-1).flatten(-2)


class Attention(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.head_dim = config.dim // config.heads
        self.wq = nn.Linear(config.dim, config.heads * self.head_dim, bias=False)
        self.wk = nn.Linear(config.dim, config.kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(config.dim, config.kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(config.heads * self.head_dim, config.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds its share of them.
        q, k, v = (
            projection(x).view(batch, length, -1, self.head_dim).transpose(1, 2)
            for projection in (self.wq, self.wk, self.wv)
        )
        q, k = _rotated(q, cos, sin), _rotated(k, cos, sin)
        attended = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.wo(attended.transpose(1, 2).reshape(batch, length, -1))


class FeedForward(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(config.dim, config.ffn_dim, bias=False)
        self.w2 = nn.Linear(config.ffn_dim, config.dim, bias=False)
        self.w3 = nn.Linear(config.dim, config.ffn_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(nn.functional.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(config.dim)
        self.attention = Attention(config)
        self.ffn_norm = RMSNorm(config.dim)
        self.feed_forward = FeedForward(config)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    cos: torch.Tensor
    sin: torch.Tensor

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_embeddings = nn.Embedding(config.vocab, config.dim)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.norm = RMSNorm(config.dim)
        self.output = nn.Linear(config.dim, config.vocab, bias=False)
        head_dim = config.dim // config.heads
        frequencies = 1.0 / config.rope_theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        angles = torch.outer(torch.arange(config.context, dtype=torch.float32), frequencies)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        cos, sin = self.cos[:length], self.sin[:length]
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, cos, sin)
        return self.output(self.norm(h))


def tensor_parallel_plan(model: Llama, mesh: Any) -> None:
    """Split ``model`` over the 1-D ``mesh``: torchtitan's Llama plan, without sequence parallelism."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    parallelize_module(
        model,
        mesh,
        {
            "tok_embeddings": RowwiseParallel(input_layouts=Replicate()),
            "output": ColwiseParallel(output_layouts=Replicate()),
        },
    )
    block_plan = {
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w3": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(),
    }
    for layer in model.layers:
        parallelize_module(layer, mesh, block_plan)


class LlamaModule(Module):
    """The decoder as a stratagem module: built in ``configure_model``, split when the mesh has ``tp > 1``.

    ``size`` picks a configuration of :data:`SIZES`; other keyword arguments override its fields.
    """

    def __init__(self, size: str = "tiny", learning_rate: float = 3e-4, **overrides: Any) -> None:
        super().__init__()
        if size not in SIZES:
            raise ValueError(f"size={size!r} is not valid; expected one of {', '.join(map(repr, SIZES))}.")
        unknown = sorted(set(overrides) - set(asdict(SIZES[size])))
        if unknown:
            raise TypeError(
                f"LlamaModule got unknown config fields {unknown}; known: {', '.join(asdict(SIZES[size]))}."
            )
        self.config = LlamaConfig(**{**asdict(SIZES[size]), **overrides})
        self.learning_rate = learning_rate
        self.model: Llama | None = None
        self.example_input_array = torch.zeros(1, self.config.context, dtype=torch.long)

    def configure_model(self) -> None:
        if self.model is not None:
            return
        self.model = Llama(self.config)
        mesh = self.device_mesh
        if mesh is not None and "tp" in (mesh.mesh_dim_names or ()) and mesh["tp"].size() > 1:
            tensor_parallel_plan(self.model, mesh["tp"])

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        assert self.model is not None, "configure_model() builds the model"
        return self.model(tokens)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        tokens = batch[0] if isinstance(batch, list | tuple) else batch
        logits = self(tokens[:, :-1])
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), tokens[:, 1:].reshape(-1))

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=self.learning_rate)
