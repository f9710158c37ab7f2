"""``xla_fsdp``: torch_xla's ``XlaFullyShardedDataParallel``, one replica per device."""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn
from torch.optim import Optimizer

from stratagem.accelerators import Accelerator
from stratagem.checkpoint_io import PathLike, write_staged
from stratagem.precision import Precision
from stratagem.strategies.live_state import is_optimizer_list
from stratagem_xla.checkpoint_io import SHARD_FILE, XLAShardedCheckpointIO, shard_files, to_cpu
from stratagem_xla.parallel import XLAStrategy
from stratagem_xla.shards import plain_name, shard_names, shard_of, whole_state_gathered
from stratagem_xla.wrapping import auto_wrap_policy, checkpointing_wrapper, module_classes

_NAME = "XLAFSDPStrategy"


class XLAFSDPStrategy(XLAStrategy):
    """Parameters, gradients and optimizer state sharded over the replicas by ``XlaFullyShardedDataParallel``.

    ``auto_wrap_policy``: module classes wrapped as their own FSDP units; ``activation_checkpointing``: module
    classes whose activations are recomputed in backward. XlaFSDP replaces the module's parameters by its flat
    shards, so ``configure_optimizers`` must build the optimizer from ``self.trainer.model.parameters()`` (the
    wrapped module's), as in Lightning. ``state_dict_type="sharded"`` (default) saves a directory of one file per
    rank, which any strategy and ``stratagem consolidate`` read as whole weights and from which ``xla_fsdp`` at the
    same world size resumes with its optimizer state; ``"full"`` gathers the whole weights into one file (no
    optimizer state: its shards fit only XlaFSDP).
    """

    strategy_name = "xla_fsdp"

    def __init__(
        self,
        accelerator: Accelerator | None = None,
        precision: Precision | None = None,
        parallel_devices: list[torch.device] | None = None,
        auto_wrap_policy: type[nn.Module] | Iterable[type[nn.Module]] | None = None,
        activation_checkpointing: type[nn.Module] | Iterable[type[nn.Module]] | None = None,
        state_dict_type: Literal["full", "sharded"] = "sharded",
        debug: bool = False,
        start_method: str = "spawn",
    ) -> None:
        super().__init__(
            accelerator=accelerator,
            precision=precision,
            checkpoint_io=XLAShardedCheckpointIO(),
            parallel_devices=parallel_devices,
            debug=debug,
            start_method=start_method,
        )
        self.auto_wrap_classes = module_classes(auto_wrap_policy, "auto_wrap_policy", _NAME)
        self.checkpointed_classes = module_classes(activation_checkpointing, "activation_checkpointing", _NAME)
        if state_dict_type not in ("full", "sharded"):
            raise ValueError(
                f"{_NAME}(state_dict_type={state_dict_type!r}) is not valid; expected 'full' or 'sharded'."
            )
        self.state_dict_type = state_dict_type

    def setup_module(self, module: nn.Module) -> nn.Module:
        from torch_xla.distributed.fsdp import XlaFullyShardedDataParallel

        module = self.precision.convert_module(module).to(self.root_device)
        self._module = module
        self._model = XlaFullyShardedDataParallel(
            module,
            auto_wrap_policy=auto_wrap_policy(self.auto_wrap_classes),
            auto_wrapper_callable=checkpointing_wrapper(XlaFullyShardedDataParallel, self.checkpointed_classes),
        )
        return self._model

    def optimizer_step(self, optimizer: Optimizer) -> Any:
        # XlaFSDP reduce-scatters the gradients in backward; an all-reduce here would sum them again.
        return self.precision.optimizer_step(optimizer, optimizer.step)

    def clip_gradients(
        self, optimizer: Optimizer, clip_val: float, algorithm: Literal["norm", "value"] = "norm"
    ) -> Any:
        if algorithm == "norm":
            self.precision.unscale_gradients(optimizer)
            return self.model.clip_grad_norm_(clip_val)  # type: ignore[operator]
        return super().clip_gradients(optimizer, clip_val, algorithm)

    # -- checkpoints ------------------------------------------------------------------------

    def module_full_state_dict(self) -> dict[str, Any]:
        shard_state = to_cpu(self.model.state_dict())
        metadata = self.model.get_shard_metadata()  # type: ignore[operator]
        return whole_state_gathered(shard_state, metadata, self._gathered(shard_state))

    def save_checkpoint(self, path: PathLike, state: dict[str, Any]) -> None:
        self._require_live_process_group("save a checkpoint")
        rest = {key: self._state_of(value) for key, value in state.items() if not isinstance(value, nn.Module)}
        if self.state_dict_type == "full":
            rest.pop("optimizers", None)
            whole = {"module": self.module_full_state_dict(), **to_cpu(rest)}
            self.write_on_rank_zero(lambda: XLAShardedCheckpointIO().save_checkpoint(whole, path), f"save {path}")
            return
        shard = {
            "module_shard": to_cpu(self.model.state_dict()),
            "shard_metadata": self.model.get_shard_metadata(),  # type: ignore[operator]
            **to_cpu(rest if self.is_global_zero else {"optimizers": rest.get("optimizers")}),
        }
        name = SHARD_FILE.format(rank=self.global_rank, world_size=self.world_size)
        write_staged(Path(path), self, lambda staging: torch.save(shard, staging / name))

    def load_checkpoint(
        self, path: PathLike, state: dict[str, Any], strict: bool = True, weights_only: bool = True
    ) -> dict[str, Any]:
        target = Path(path)
        own_shards = XLAShardedCheckpointIO.can_read(target) and len(shard_files(target)) == self.world_size
        if not own_shards:
            # Whole weights from any strategy: each rank takes its part of every parameter.
            if any(isinstance(value, Optimizer | list | tuple) for value in state.values()):
                raise ValueError(
                    f"xla_fsdp resumes optimizer state only from its own sharded checkpoint at the same world size "
                    f"({self.world_size}); {str(path)!r} is not one. Load its weights (validate, test, predict, or "
                    "fit from the module's weights loaded yourself) instead of resuming from it."
                )
            remaining = super().load_checkpoint(path, {}, strict, weights_only)
            self._load_whole_module(remaining.pop("module"), strict)
            return remaining
        from stratagem.checkpoint_io import load_torch_file

        mine = load_torch_file(
            target / SHARD_FILE.format(rank=self.global_rank, world_size=self.world_size), weights_only=weights_only
        )
        first = mine if self.is_global_zero else load_torch_file(shard_files(target)[0], weights_only=weights_only)
        self.model.load_state_dict(mine["module_shard"], strict=strict)
        for target_state in state.values():
            if is_optimizer_list(target_state):
                for optimizer, optimizer_state in zip(target_state, mine["optimizers"], strict=True):
                    optimizer.load_state_dict(optimizer_state)
        skipped = {"module_shard", "shard_metadata", "optimizers", *state}
        return {key: value for key, value in first.items() if key not in skipped}

    def _load_whole_module(self, whole: dict[str, torch.Tensor], strict: bool) -> None:
        metadata = self.model.get_shard_metadata()  # type: ignore[operator]
        names = shard_names(metadata)
        current = self.model.state_dict()
        sharded = {}
        for key, value in current.items():
            if key in names:
                sharded[key] = shard_of(whole[names[key][0]], value.cpu(), self.global_rank)
            elif plain_name(key) in whole:
                sharded[key] = whole[plain_name(key)]
        self.model.load_state_dict(sharded, strict=strict)

    def _gathered(self, shard_state: dict[str, torch.Tensor]) -> Any:
        def gather(key: str) -> torch.Tensor:
            shard = shard_state[key].reshape(-1)
            if self.world_size == 1:
                return shard
            return self.all_gather(shard.to(self.root_device)).reshape(-1).cpu()

        return gather

    def remove_checkpoint(self, path: PathLike) -> None:
        self.write_on_rank_zero(lambda: shutil.rmtree(path, ignore_errors=True), f"remove {path}")
