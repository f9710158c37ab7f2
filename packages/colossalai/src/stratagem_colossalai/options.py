"""How ColossalAIStrategy's options are checked: the plugin, its options, and Lightning's ColossalAIStrategy options.

Everything here is data about colossalai 0.5.0 kept without importing it, so that a bad option is refused
in the calling process, before any process starts and without paying colossalai's import.
``tests/test_colossalai_options.py`` holds these tables to the installed colossalai's signatures.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Plugin:
    """A ColossalAI Booster plugin: its class, the options its constructor takes, and why it needs CUDA (if it does)."""

    class_name: str
    options: tuple[str, ...]
    cuda_only: str | None = None


_LOSS_SCALER_OPTIONS = (
    "initial_scale",
    "min_scale",
    "growth_factor",
    "backoff_factor",
    "growth_interval",
    "hysteresis",
    "max_scale",
)
"""The dynamic loss scaler's options: GeminiPlugin, LowLevelZeroPlugin and Lightning's strategy all take them."""

PLUGINS: dict[str, Plugin] = {
    "ddp": Plugin(
        "TorchDDPPlugin",
        (
            "broadcast_buffers",
            "bucket_cap_mb",
            "find_unused_parameters",
            "check_reduction",
            "gradient_as_bucket_view",
            "static_graph",
            "fp8_communication",
        ),
    ),
    "gemini": Plugin(
        "GeminiPlugin",
        (
            "chunk_config_dict",
            "chunk_init_device",
            "placement_policy",
            "enable_gradient_accumulation",
            "max_prefetch",
            "shard_param_frac",
            "offload_optim_frac",
            "offload_param_frac",
            "warmup_non_model_data_ratio",
            "steady_cuda_cap_ratio",
            "precision",
            "master_weights",
            "pin_memory",
            "force_outputs_fp32",
            "strict_ddp_mode",
            "search_range_m",
            "hidden_dim",
            "min_chunk_size_m",
            "memstats",
            "gpu_margin_mem_ratio",
            *_LOSS_SCALER_OPTIONS,
            "max_norm",
            "norm_type",
            "tp_size",
            "extra_dp_size",
            "enable_all_optimization",
            "enable_fused_normalization",
            "enable_flash_attention",
            "enable_sequence_parallelism",
            "enable_jit_fused",
            "enable_async_reduce",
            "use_fp8",
            "verbose",
            "fp8_communication",
        ),
        cuda_only="Gemini's chunk manager moves parameter chunks between GPU and CPU memory and supports only "
        "'cuda' and 'npu' devices",
    ),
    "low_level_zero": Plugin(
        "LowLevelZeroPlugin",
        (
            "stage",
            "precision",
            *_LOSS_SCALER_OPTIONS,
            "max_norm",
            "norm_type",
            "reduce_bucket_size_in_m",
            "communication_dtype",
            "overlap_communication",
            "overlap_allgather",
            "cpu_offload",
            "master_weights",
            "verbose",
            "cast_inputs",
            "fp8_communication",
            "use_fp8",
            "extra_dp_size",
        ),
        cuda_only="its ZeRO optimizer keeps the model and its flat buffers on the accelerator and supports only "
        "'cuda' and 'npu' devices",
    ),
    "torch_fsdp": Plugin(
        "TorchFSDPPlugin",
        (
            "process_group",
            "sharding_strategy",
            "cpu_offload",
            "auto_wrap_policy",
            "backward_prefetch",
            "mixed_precision",
            "ignored_modules",
            "param_init_fn",
            "sync_module_states",
            "fp8_communication",
        ),
        cuda_only="it wraps the model with device_id=torch.cuda.current_device() and supports only 'cuda' devices",
    ),
}

LIGHTNING_GEMINI_OPTIONS = (
    "placement_policy",
    "force_outputs_fp32",
    "gpu_margin_mem_ratio",
    *_LOSS_SCALER_OPTIONS,
)
"""Lightning's ColossalAIStrategy options that ColossalAI 0.5.0's GeminiPlugin still takes, by the same name."""

LIGHTNING_REMOVED_OPTIONS: dict[str, str] = {
    "use_chunk": "ColossalAI's Gemini always keeps parameters in chunks now; drop the option",
    "chunk_size": "Gemini searches the chunk size itself: steer the search with search_range_m and "
    "min_chunk_size_m, or give chunk_config_dict, in plugin_options",
    "enable_distributed_storage": "replaced by shard_param_frac in plugin_options (1.0 shards every parameter, "
    "0.0 none)",
    "chunk_search_range": "replaced by search_range_m in plugin_options (the range in MiB, not bytes)",
    "chunk_search_n_grids": "removed from ColossalAI's chunk search; hidden_dim in plugin_options speeds it up",
    "min_chunk_size": "replaced by min_chunk_size_m in plugin_options (MiB, not bytes)",
}
"""Lightning's ColossalAIStrategy options that ColossalAI 0.5.0 no longer has, with what replaced them."""

# Lightning's placement policies that ColossalAI 0.5.0 expresses as "static" placement with fractions.
_OLD_PLACEMENTS = {
    "cpu": "placement_policy='static' with plugin_options={'shard_param_frac': 1.0, 'offload_optim_frac': 1.0, "
    "'offload_param_frac': 1.0}",
    "cuda": "placement_policy='static' with plugin_options={'shard_param_frac': 1.0, 'offload_optim_frac': 0.0}",
}
_PLACEMENTS = ("static", "auto")


def check_plugin(plugin: Any) -> str:
    """The plugin name, or a ValueError naming the accepted ones."""
    if isinstance(plugin, str) and (plugin == "auto" or plugin in PLUGINS):
        return str(plugin)
    raise ValueError(
        f"ColossalAIStrategy(plugin={plugin!r}) is not a plugin; expected 'auto' (gemini when Lightning's Gemini "
        f"options are given, else ddp) or one of {', '.join(map(repr, PLUGINS))}."
    )


def check_plugin_options(plugin: str, options: Mapping[str, Any]) -> None:
    """Raise a TypeError for an option ``plugin``'s constructor does not take, naming the ones it does."""
    accepted = PLUGINS[plugin].options
    unknown = sorted(name for name in options if name not in accepted)
    if unknown:
        raise TypeError(
            f"ColossalAIStrategy(plugin={plugin!r}) got plugin_options ColossalAI's {PLUGINS[plugin].class_name} does "
            f"not take: {', '.join(unknown)}; it takes {', '.join(accepted)}."
        )


def lightning_options_to_gemini(options: Mapping[str, Any]) -> dict[str, Any]:
    """Lightning's ColossalAIStrategy keywords as GeminiPlugin options; a removed or unknown one is refused by name."""
    removed = [name for name in options if name in LIGHTNING_REMOVED_OPTIONS]
    if removed:
        raise ValueError(
            "ColossalAIStrategy does not take Lightning's "
            + "; ".join(f"{name}={options[name]!r}: {LIGHTNING_REMOVED_OPTIONS[name]}" for name in removed)
            + "."
        )
    unknown = sorted(name for name in options if name not in LIGHTNING_GEMINI_OPTIONS)
    if unknown:
        raise TypeError(
            f"ColossalAIStrategy got unexpected keyword arguments {', '.join(unknown)}; beyond plugin, plugin_options "
            f"and the parallel options it takes Lightning's Gemini options {', '.join(LIGHTNING_GEMINI_OPTIONS)}."
        )
    placement = options.get("placement_policy")
    if placement in _OLD_PLACEMENTS:
        raise ValueError(
            f"ColossalAIStrategy(placement_policy={placement!r}) is Lightning's placement; ColossalAI 0.5.0 spells it "
            f"{_OLD_PLACEMENTS[placement]}."
        )
    if placement is not None and placement not in _PLACEMENTS:
        raise ValueError(
            f"ColossalAIStrategy(placement_policy={placement!r}) is not valid; expected one of "
            f"{', '.join(map(repr, _PLACEMENTS))}."
        )
    return dict(options)


def check_colossalai_installed() -> None:
    """Raise an ImportError saying how to install colossalai when it is not installed (without importing it)."""
    # Not a registry requirement: its hint would be `pip install colossalai`, which replaces torch with 2.5.1.
    if importlib.util.find_spec("colossalai") is None:
        raise ImportError(
            "ColossalAIStrategy needs colossalai, which is not installed. colossalai 0.5.0 declares torch<=2.5.1, "
            "so install it without its dependencies, then what it imports: `pip install --no-deps colossalai==0.5.0` "
            "and `pip install peft galore-torch einops`, both with `-c tools/constraints.txt` to keep your torch."
        )
