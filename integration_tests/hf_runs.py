"""What one rank does in the Hugging Face model tests: train a tiny ``transformers`` model on a token rule.

The user's trial scenario: a causal LM built from a config (no download) in ``configure_model``, trained on
sequences that follow ``next token = (token + 1) mod VOCAB``. ``transformers`` is imported only inside
``configure_model`` and the strategy options, as users write it (under ZeRO-3 that import once failed).
Module-level functions, so that a :class:`stratagem.testing.DistributedWorkers` pool (whose ranks look like
torchrun's) or the test process itself can run them.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import stratagem
from stratagem.callbacks import ModelCheckpoint
from stratagem.trainer.rng import seed_everything

VOCAB = 16
SEQUENCE = 8
GLOBAL_BATCH = 16
STEPS = 20
RESUME_FROM_STEP = 10
SEED = 0
LEARNING_RATE = 0.02

_DECODER_LAYERS = {
    "gpt2": ("transformers.models.gpt2.modeling_gpt2", "GPT2Block"),
    "llama": ("transformers.models.llama.modeling_llama", "LlamaDecoderLayer"),
    "qwen2": ("transformers.models.qwen2.modeling_qwen2", "Qwen2DecoderLayer"),
}
FAMILIES = tuple(_DECODER_LAYERS)


def hf_model(family: str) -> nn.Module:
    """A two-layer causal LM of ``family``, without dropout (so that any number of ranks computes alike)."""
    import transformers

    common = {"vocab_size": VOCAB, "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0}
    if family == "gpt2":
        config = transformers.GPT2Config(
            n_positions=2 * SEQUENCE, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0, embd_pdrop=0.0,
            attn_pdrop=0.0, **common,
        )  # fmt: skip
        return transformers.GPT2LMHeadModel(config)
    shape = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 2 * SEQUENCE,
    }
    if family == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**shape, **common))
    if family == "qwen2":
        # Tied embeddings, as Qwen2's small checkpoints have them; q/k/v carry biases.
        return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**shape, tie_word_embeddings=True, **common))
    raise ValueError(f"family={family!r}; expected one of {FAMILIES}")


def decoder_layer(family: str) -> type[nn.Module]:
    """The decoder-layer class, as users hand it to the wrap and activation-checkpointing policies."""
    import importlib

    module_name, class_name = _DECODER_LAYERS[family]
    return getattr(importlib.import_module(module_name), class_name)


class TokenRuleModel(stratagem.Module):
    """A ``transformers`` causal LM built in ``configure_model``; records what it starts from."""

    def __init__(self, family: str) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.family = family
        self.model: nn.Module | None = None
        self.initial_state: dict[str, torch.Tensor] = {}
        self.initial_buffers: dict[str, torch.Tensor] = {}

    def configure_model(self) -> None:
        if self.model is None:
            self.model = hf_model(self.family)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        assert self.model is not None
        return self.model(input_ids=batch[0], labels=batch[0]).loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        assert self.model is not None
        self.log("val_loss", self.model(input_ids=batch[0], labels=batch[0]).loss, sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=LEARNING_RATE)

    def on_train_start(self) -> None:
        if self.trainer.global_step == 0:
            # Copies: some strategies' full state dict shares memory with the live weights.
            state = self.trainer.strategy.module_full_state_dict()
            self.initial_state = {name: value.detach().clone() for name, value in state.items()}
            # Non-persistent buffers (Llama's rotary inv_freq) are in no state dict: each rank's own.
            self.initial_buffers = {name: buffer.detach().cpu().clone() for name, buffer in self.named_buffers()}


def token_rule_loader(sequences: int, seed: int, batch_size: int) -> DataLoader:
    """Sequences that count up from a random token: ``next = (token + 1) mod VOCAB``."""
    starts = torch.randint(0, VOCAB, (sequences, 1), generator=torch.Generator().manual_seed(seed))
    return DataLoader(TensorDataset((starts + torch.arange(SEQUENCE)) % VOCAB), batch_size=batch_size)


def _strategy(name: str, family: str) -> Any:
    if name == "fsdp":
        from stratagem_fsdp import FSDPStrategy

        layer = decoder_layer(family)
        return FSDPStrategy(auto_wrap_policy={layer}, activation_checkpointing_policy={layer})
    return name


def _trainer(strategy: str, family: str, devices: int, root: Path, **options: Any) -> stratagem.Trainer:
    return stratagem.Trainer(
        strategy=_strategy(strategy, family),
        accelerator="cpu",
        devices=devices,
        precision="32-true",
        default_root_dir=root,
        logger=False,
        enable_progress_bar=False,
        num_sanity_val_steps=0,
        seed=SEED,
        max_steps=STEPS,
        **options,
    )


def eager_build(family: str) -> TokenRuleModel:
    """The module built eagerly on this process's CPU from the runs' seed: what every strategy must start from."""
    seed_everything(SEED)
    module = TokenRuleModel(family)
    module.configure_model()
    return module


def _largest_difference(values: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> dict[str, float]:
    """Per name, the largest absolute difference (``inf`` where a name is missing on either side)."""
    differences = {}
    for name in expected.keys() | values.keys():
        if name not in values or name not in expected or values[name].shape != expected[name].shape:
            differences[name] = float("inf")
        else:
            differences[name] = (values[name].float() - expected[name].float()).abs().max().item()
    return differences


def train_resume_validate(strategy: str, family: str, devices: int, root: str) -> dict[str, Any]:
    """Fit ``STEPS`` steps saving at ``RESUME_FROM_STEP``, resume a second fit from there, validate both.

    Returns (meaningful on rank 0) how far the initial weights and each rank's buffers are from the
    eager build, both validation losses, and the final checkpoint's path.
    """
    directory = Path(root)
    world = devices
    train = token_rule_loader(STEPS * GLOBAL_BATCH, seed=1, batch_size=GLOBAL_BATCH // world)
    validation = token_rule_loader(GLOBAL_BATCH, seed=2, batch_size=GLOBAL_BATCH // world)
    checkpoint = ModelCheckpoint(
        dirpath=directory / "checkpoints", filename="{step}", every_n_train_steps=RESUME_FROM_STEP, save_top_k=-1
    )
    trainer = _trainer(strategy, family, devices, directory, callbacks=[checkpoint])
    module = TokenRuleModel(family)
    trainer.fit(module, train)
    [validated] = trainer.validate(module, validation)
    reference = eager_build(family)
    weights = _largest_difference(module.initial_state, reference.state_dict()) if module.initial_state else {}
    buffers = _largest_difference(module.initial_buffers, dict(reference.named_buffers()))

    resumed_trainer = _trainer(strategy, family, devices, directory / "resumed", enable_checkpointing=False)
    resumed = TokenRuleModel(family)
    middle = directory / "checkpoints" / f"step={RESUME_FROM_STEP}{_suffix(directory / 'checkpoints')}"
    resumed_trainer.fit(resumed, train, ckpt_path=str(middle))
    [resumed_validated] = resumed_trainer.validate(resumed, validation)
    final = directory / "checkpoints" / f"step={STEPS}{_suffix(directory / 'checkpoints')}"
    return {
        "weights": weights,
        "buffers": buffers,
        "val_loss": float(validated["val_loss"]),
        "resumed_val_loss": float(resumed_validated["val_loss"]),
        "resumed_global_step": resumed_trainer.global_step,
        "checkpoint": str(final),
    }


def _suffix(directory: Path) -> str:
    """``.ckpt`` where the strategy saves files, nothing where it saves directories of shards."""
    return ".ckpt" if any(path.suffix == ".ckpt" for path in directory.iterdir()) else ""


def generated_continuations(
    checkpoint: str, prompts: int = 8, new_tokens: int = 6
) -> tuple[torch.Tensor, torch.Tensor]:
    """``load_from_checkpoint`` then greedy ``generate`` from one-token prompts; the generated and the rule's tokens."""
    module = TokenRuleModel.load_from_checkpoint(checkpoint)
    assert module.model is not None
    prompt = torch.arange(1, prompts + 1).unsqueeze(1)
    with torch.no_grad():
        generated = module.model.generate(
            input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens, do_sample=False
        )
    expected = (prompt + torch.arange(new_tokens + 1)) % VOCAB
    return generated, expected


def build_under_zero_3_importing_transformers_first() -> tuple[bool, int]:
    """Build GPT-2 in ZeRO-3's init context for loaded weights, importing ``transformers`` inside, and partition it.

    Inside ``zero.Init`` that first import raised a ``TypeError`` (torch._dynamo checks the tensor constructors
    zero.Init replaced); the strategy no longer opens it around user code.
    """
    loaded_before = "torch._dynamo" in sys.modules or "transformers" in sys.modules
    strategy = stratagem.resolve(strategy="deepspeed_stage_3", accelerator="cpu", devices=1)
    strategy.setup_environment()
    with strategy.module_init_context(empty_init=True):
        model = hf_model("gpt2")
    strategy.setup_module(model)
    return loaded_before, sum(parameter.ds_numel for parameter in model.parameters())
