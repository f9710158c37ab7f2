"""ColossalAIStrategy: one process per device, the module boosted by a ColossalAI Booster plugin.

stratagem starts the processes and joins them in a ``torch.distributed`` group (ColossalAI's Booster
only needs that group to exist); the Booster's plugin wraps the module. With ColossalAI 0.5.0 on
torch 2.13 only the ``ddp`` plugin (``TorchDDPPlugin``) runs without CUDA, and it is the one this
release runs: the sharded plugins (Gemini, LowLevelZero, TorchFSDP) are refused with the reason.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from torch import nn

from stratagem.strategies import BackwardSyncControl, ParallelStrategy, split_parallel_options
from stratagem_colossalai.options import (
    PLUGINS,
    check_colossalai_installed,
    check_plugin,
    check_plugin_options,
    lightning_options_to_gemini,
)

if TYPE_CHECKING:
    from colossalai.booster import Booster


class ColossalAIStrategy(ParallelStrategy, BackwardSyncControl):
    """Data-parallel training through ColossalAI's Booster.

    - ``plugin``: ``"ddp"`` (ColossalAI's ``TorchDDPPlugin``, on any device), ``"gemini"``,
      ``"low_level_zero"`` or ``"torch_fsdp"`` (CUDA only, refused by this release), or ``"auto"``
      (the default): ``"gemini"`` when Lightning's Gemini options are given, ``"ddp"`` otherwise.
    - ``plugin_options``: keyword arguments of the plugin's constructor (``bucket_cap_mb``,
      ``find_unused_parameters``, ... for ``ddp``), checked against what it takes.
    - Lightning's ColossalAIStrategy options that GeminiPlugin still has (``placement_policy``,
      ``force_outputs_fp32``, ``gpu_margin_mem_ratio`` and the loss-scaler options) are taken as
      Gemini's; those ColossalAI removed are refused naming what replaced them.
    """

    max_optimizers: ClassVar[int | None] = 1

    def __init__(
        self,
        *,
        plugin: str = "auto",
        plugin_options: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> None:
        check_colossalai_installed()
        parallel_options, lightning_options = split_parallel_options(options)
        requested = check_plugin(plugin)
        if plugin_options is not None and not isinstance(plugin_options, Mapping):
            raise TypeError(
                f"ColossalAIStrategy(plugin_options={plugin_options!r}) is not valid; expected a dict of the plugin's "
                "keyword arguments."
            )
        gemini_options = lightning_options_to_gemini(lightning_options)
        if requested == "auto":
            requested = "gemini" if gemini_options else "ddp"
        if gemini_options and requested != "gemini":
            raise ValueError(
                f"ColossalAIStrategy({', '.join(sorted(gemini_options))}) are Gemini's options (Lightning's "
                f"ColossalAIStrategy was Gemini); plugin={plugin!r} does not take them: use plugin='gemini', or drop "
                "them."
            )
        plugin_kwargs = dict(plugin_options or {})
        both = sorted(set(plugin_kwargs) & set(gemini_options))
        if both:
            raise ValueError(
                f"ColossalAIStrategy got {', '.join(both)} both as keywords and in plugin_options; give it once."
            )
        plugin_kwargs.update(gemini_options)
        check_plugin_options(requested, plugin_kwargs)
        super().__init__(**parallel_options)
        self.plugin = requested
        self.plugin_options = plugin_kwargs
        self._booster: Booster | None = None

    def complete_configuration(self) -> None:
        reason = PLUGINS[self.plugin].cuda_only
        if reason is None:
            return
        device_type = self.accelerator.device_type
        if device_type != "cuda":
            raise ValueError(
                f"ColossalAIStrategy(plugin={self.plugin!r}) cannot run on accelerator={device_type!r}: ColossalAI's "
                f"{PLUGINS[self.plugin].class_name} needs CUDA ({reason}). On {device_type!r} use plugin='ddp'."
            )
        raise ValueError(
            f"ColossalAIStrategy(plugin={self.plugin!r}) is not supported by stratagem-colossalai 0.1: the sharded "
            "plugins own the optimizer step and write sharded checkpoints, and this release was built and tested "
            "without a GPU, so it runs only plugin='ddp'. For sharded training use strategy='fsdp' or "
            "'deepspeed_stage_3'."
        )

    def setup_module(self, module: nn.Module) -> nn.Module:
        from colossalai.booster import Booster
        from colossalai.booster.plugin import TorchDDPPlugin

        module = super().setup_module(module)
        # The plugin wraps in DistributedDataParallel, which broadcasts rank 0's weights: ranks start equal.
        self._booster = Booster(plugin=TorchDDPPlugin(**self.plugin_options))
        model, *_ = self._booster.boost(module)
        self._model = model
        return model

    def no_backward_sync(self, enabled: bool) -> contextlib.AbstractContextManager[Any]:
        if not enabled or self._booster is None:
            return contextlib.nullcontext()
        return self._booster.no_sync(self.model)

    def teardown(self) -> None:
        self._booster = None
        super().teardown()

    def __repr__(self) -> str:
        return f"ColossalAIStrategy(plugin={self.plugin!r}, devices={self.num_processes})"
