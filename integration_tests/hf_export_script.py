"""A tiny Hugging Face GPT-2 (built from a config, no download) fitted by the Trainer, started by the tests as
``python hf_export_script.py --strategy NAME --root DIR``; the strategy's launcher re-runs it for rank 1.

At the end of training every rank runs the trained module on fixed tokens and rank 0 writes the logits to
``<root>/trained_logits.pt``; the checkpoint saved then (``on_train_end``) is ``<root>/trained.ckpt``, and
``config.json`` the model's config as ``transformers`` saves it. Each rank writes the losses of its steps to
``<root>/losses_rank<r>.pt``. ``--pretrained DIR`` starts from the weights ``save_pretrained`` wrote there:
``--build eager`` loads them with ``from_pretrained`` in ``__init__``, ``--build configure_model`` builds the
model in ``configure_model`` and asks ``load_pretrained`` for them.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader
from transformers import GPT2Config, GPT2LMHeadModel

import stratagem
from stratagem import Trainer
from stratagem.callbacks.callback import Callback

VOCABULARY = 64
SEQUENCE = 12


def gpt2_config() -> GPT2Config:
    # No dropout: the logits are compared after training, outside the step that ran them.
    return GPT2Config(
        vocab_size=VOCABULARY, n_positions=SEQUENCE, n_embd=32, n_layer=2, n_head=2,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip


def probe_tokens() -> torch.Tensor:
    return torch.randint(0, VOCABULARY, (3, SEQUENCE), generator=torch.Generator().manual_seed(7))


class TinyGPT2(stratagem.Module):
    """The Hugging Face model held as ``self.model``, as users write it: its keys are ``model.*``."""

    def __init__(self, pretrained: Path | None = None, build: str = "eager") -> None:
        super().__init__()
        self.pretrained, self.build = pretrained, build
        self.model: GPT2LMHeadModel | None = None
        self.losses: list[torch.Tensor] = []
        if build == "eager":
            self.model = (
                GPT2LMHeadModel(gpt2_config()) if pretrained is None else GPT2LMHeadModel.from_pretrained(pretrained)
            )

    def configure_model(self) -> None:
        if self.model is None:
            self.model = GPT2LMHeadModel(gpt2_config())
            self.load_pretrained(self.pretrained, into=self.model)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids).logits

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss = self.model(input_ids=batch, labels=batch).loss
        self.losses.append(loss.detach().cpu())
        return loss

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        self.log("val_loss", self.model(input_ids=batch, labels=batch).loss)

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


class SaveTrained(Callback):
    def __init__(self, root: Path) -> None:
        self.root = root

    def on_train_end(self, trainer: Trainer, module: Any) -> None:
        module.eval()
        with torch.no_grad():
            # Through what the strategy made of the module (FSDP's root, DeepSpeed's engine), which gathers shards.
            logits = trainer.strategy.model(probe_tokens().to(trainer.strategy.root_device))
        if trainer.is_global_zero:
            torch.save(logits.cpu(), self.root / "trained_logits.pt")
        trainer.save_checkpoint(self.root / "trained.ckpt")
        torch.save(torch.stack(module.losses), self.root / f"losses_rank{trainer.global_rank}.pt")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", required=True)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--max-steps", type=int, default=4)
    parser.add_argument("--pretrained", type=Path, default=None, help="a save_pretrained directory to start from")
    parser.add_argument("--build", choices=("eager", "configure_model"), default="eager")
    args = parser.parse_args()
    args.root.mkdir(parents=True, exist_ok=True)
    gpt2_config().save_pretrained(args.root)
    tokens = torch.randint(0, VOCABULARY, (32, SEQUENCE), generator=torch.Generator().manual_seed(0))
    trainer = Trainer(
        strategy=args.strategy,
        accelerator="cpu",
        devices=args.devices,
        max_steps=args.max_steps,
        default_root_dir=args.root,
        callbacks=[SaveTrained(args.root)],
        enable_checkpointing=False,
        logger=False,
        enable_progress_bar=False,
        num_sanity_val_steps=0,
        seed=0,
    )
    trainer.fit(TinyGPT2(args.pretrained, args.build), DataLoader(list(tokens), batch_size=8))


if __name__ == "__main__":
    main()
