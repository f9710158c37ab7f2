"""DeepSpeedStrategy: ZeRO stages 0-3 with optional CPU/NVMe offload, driven through DeepSpeed's engine."""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import sys
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch
from torch import nn
from torch.optim import Optimizer

from stratagem.checkpoint_io import (
    CheckpointError,
    CheckpointIO,
    LazyCheckpoint,
    PathLike,
    optional_checkpoint_file,
    write_staged,
)
from stratagem.checkpoint_io.safetensors_import import SafetensorsWeights, copy_whole, load_pretrained_weights
from stratagem.strategies import (
    LayoutSharding,
    LoopSettings,
    MemoryEstimate,
    ModelFootprint,
    OwnsAccumulation,
    ParallelStrategy,
    SuppliesOptimizer,
    TakesLoopSettings,
    TakesLRSchedulers,
    check_release_host_memory,
    release_freed_host_memory,
    releases_host_memory,
    skip_parameter_init,
    split_parallel_options,
)
from stratagem.strategies.compilation import strip_compile_prefix
from stratagem.strategies.live_state import is_optimizer_list
from stratagem.strategies.rank_zero_build import rank_zero_build, refuse_differently_built, refuse_meta_attributes
from stratagem_deepspeed import checkpoint_layout as layout
from stratagem_deepspeed.activation_checkpointing import (
    check_activation_checkpointing,
    configure_activation_checkpointing,
)
from stratagem_deepspeed.buffer_sizes import fitted_sizes, gpu_sizes, largest_parameter_elements
from stratagem_deepspeed.checkpoint_io import DeepSpeedCheckpointIO, read_state_file
from stratagem_deepspeed.config import ZeroOptions, load_config, offload_devices, reconcile, zero_stage
from stratagem_deepspeed.config_optimizer import check_optimizer_section
from stratagem_deepspeed.engine_state import gather_module_state, load_module_state, load_optimizer_state
from stratagem_deepspeed.environment import (
    async_io_problem,
    check_config_with_deepspeed,
    import_deepspeed,
    select_deepspeed_accelerator,
)
from stratagem_deepspeed.lightning_options import parse_lightning_options, upgrade_boolean_offload
from stratagem_deepspeed.memory import RELEASING_STEP_TIME, deepspeed_estimate, zero_layout_sharding
from stratagem_deepspeed.nvme_swap import (
    release_swap_buffers,
    swapped_optimizer_state_in_memory,
    swapped_optimizer_sub_groups,
    swappers_of,
)
from stratagem_deepspeed.rank_zero_partition import partition_from_rank_zero
from stratagem_deepspeed.stage_3_release import release_partitioned_parameters

if TYPE_CHECKING:
    from deepspeed import DeepSpeedEngine


class DeepSpeedStrategy(ParallelStrategy, OwnsAccumulation, TakesLoopSettings, TakesLRSchedulers, SuppliesOptimizer):
    """Data parallelism through DeepSpeed's engine: ZeRO stage 1 shards optimizer state, stage 2
    also gradients, stage 3 also parameters (built sharded in ``configure_model``); each can
    offload to CPU memory or NVMe.

    The engine owns backward, the optimizer step, gradient accumulation and clipping; the
    Trainer drives it through this strategy's methods. Without ``config``, the options below
    build DeepSpeed's config; with one (a dict, a JSON path, or ``STRATAGEM_DEEPSPEED_CONFIG_PATH``)
    they are ignored. Either way the Trainer's precision, gradient accumulation, clipping and
    batch size are filled in, and a config that contradicts them is refused before launch.

    Args:
        stage: ZeRO stage, 0-3.
        offload_optimizer: keep optimizer state (and run its step) in ``offload_optimizer_device``.
        offload_parameters: keep parameters in ``offload_params_device`` (stage 3).
        remote_device: where ``configure_model`` creates stage-3 parameters (``"cpu"``, ``"nvme"``;
            default: the process's device).
        offload_params_device, offload_optimizer_device: ``"cpu"`` or ``"nvme"``.
        nvme_path: directory for NVMe offload files (needs DeepSpeed's async_io op, i.e. libaio).
        allgather_bucket_size, reduce_bucket_size: communication bucket sizes, in elements. Left out (and
            with them ZeRO-3's prefetch, reuse and live-parameter windows and its ``sub_group_size``, when
            the config does not set them), they are 200M on GPUs and sized to the
            model's largest parameter on the CPU, where every buffer is host memory of each process (see
            ``stratagem_deepspeed.buffer_sizes``).
        cpu_checkpointing: move checkpointed activations to CPU (not on accelerator="cpu").
        partition_activations: shard checkpointed activations across processes.
        contiguous_gradients, overlap_comm: DeepSpeed's ZeRO performance switches.
        logging_level: level of DeepSpeed's logger.
        save_full_weights: also store the gathered fp32 module in each checkpoint, so that readers
            need neither DeepSpeed nor the shards to load its weights.
        config: DeepSpeed config (dict or JSON file path), replacing the options above.
        **options: the options of every :class:`~stratagem.strategies.ParallelStrategy` (``start_method``,
            ``timeout``, ``process_group_backend``, ...; see :class:`~stratagem.strategies.ParallelOptions`), and
            Lightning's other ``DeepSpeedStrategy`` options (``pin_memory``,
            ``sub_group_size``, ``loss_scale``, ``initial_scale_power``, ``loss_scale_window``,
            ``hysteresis``, ``min_loss_scale``, ``logging_batch_size_per_gpu``, ``load_full_weights``,
            ``zero_optimization``, the NVMe ``aio`` and buffer options, ...), written to the config keys
            Lightning writes them to (see ``stratagem_deepspeed.lightning_options``).
    """

    max_optimizers: ClassVar[int | None] = 1
    max_lr_schedulers: ClassVar[int | None] = 1

    def __init__(
        self,
        *,
        stage: int = 2,
        offload_optimizer: bool = False,
        offload_parameters: bool = False,
        remote_device: Literal["cpu", "nvme"] | None = None,
        offload_params_device: Literal["cpu", "nvme"] = "cpu",
        offload_optimizer_device: Literal["cpu", "nvme"] = "cpu",
        nvme_path: str | os.PathLike[str] = "/local_nvme",
        allgather_bucket_size: int | float | None = None,
        reduce_bucket_size: int | float | None = None,
        cpu_checkpointing: bool = False,
        partition_activations: bool = False,
        contiguous_gradients: bool = True,
        overlap_comm: bool = True,
        logging_level: int = logging.WARNING,
        save_full_weights: bool = False,
        release_host_memory: bool | None = None,
        config: Mapping[str, Any] | str | os.PathLike[str] | None = None,
        **options: Any,
    ) -> None:
        parallel_options, lightning_options = split_parallel_options(options)
        self._lightning = parse_lightning_options(
            lightning_options, config_given=config is not None, own_options=inspect.signature(type(self)).parameters
        )
        if not self._lightning.zero_optimization:
            stage = 0
        super().__init__(**parallel_options)
        if remote_device not in (None, "cpu", "nvme"):
            raise ValueError(
                f"DeepSpeedStrategy(remote_device={remote_device!r}) is not valid; expected None, 'cpu' or 'nvme'."
            )
        self.remote_device = remote_device
        self.options = ZeroOptions(
            stage=stage,
            offload_optimizer=offload_optimizer,
            offload_parameters=offload_parameters,
            offload_optimizer_device=offload_optimizer_device,
            offload_params_device=offload_params_device,
            nvme_path=str(nvme_path),
            allgather_bucket_size=None if allgather_bucket_size is None else int(allgather_bucket_size),
            reduce_bucket_size=None if reduce_bucket_size is None else int(reduce_bucket_size),
            contiguous_gradients=contiguous_gradients,
            overlap_comm=overlap_comm,
            partition_activations=partition_activations,
            cpu_checkpointing=cpu_checkpointing,
        )
        self.user_config = load_config(config)
        self.logging_level = logging_level
        self.save_full_weights = save_full_weights
        self._release_host_memory = check_release_host_memory("DeepSpeedStrategy", release_host_memory)
        self._loop_settings_connected = False
        self._config: dict[str, Any] | None = None
        self._engine: DeepSpeedEngine | None = None
        self._parameter_groups: list[list[nn.Parameter]] = []
        self._nvme_swappers: list[Any] = []
        self._built_on_rank_zero = False
        self._largest_parameter: int | None = None

    # -- wiring (calling process) -------------------------------------------------------------

    def complete_configuration(self) -> None:
        # The device type of the tensors, which is the accelerator's except where a stand-in computes elsewhere.
        select_deepspeed_accelerator(self.root_device.type)
        self._reconcile()
        source = "the DeepSpeed config" if self.user_config is not None else "DeepSpeedStrategy's options"
        check_optimizer_section(self.config, source)
        check_activation_checkpointing(self.config, source)
        check_config_with_deepspeed(self.config)
        if "nvme" in offload_devices(self.config).values() or self.remote_device == "nvme":
            self._check_nvme_path()
            problem = async_io_problem()
            if problem is not None:
                raise RuntimeError(problem)

    def _check_nvme_path(self) -> None:
        zero = self.config.get("zero_optimization", {})
        paths = {(zero.get(key) or {}).get("nvme_path") for key in ("offload_optimizer", "offload_param")}
        for path in sorted(str(path) for path in paths if path):
            existing = Path(path)
            while not existing.exists() and existing != existing.parent:
                existing = existing.parent
            if not (existing.is_dir() and os.access(existing, os.W_OK)):
                raise ValueError(
                    f"nvme_path={path!r} is not writable here ({str(existing)!r} is the closest existing directory); "
                    "DeepSpeed swaps tensors to files there. Pass nvme_path= a directory on a local NVMe drive that "
                    "this user can write."
                )

    def connect_loop_settings(self, settings: LoopSettings) -> None:
        super().connect_loop_settings(settings)
        self._loop_settings_connected = True
        if self._accelerator is not None and self.parallel_devices:
            self._reconcile()

    def _reconcile(self) -> None:
        if self.user_config is not None:
            base = upgrade_boolean_offload(self.user_config)
        else:
            base = self._lightning.apply(self.options.to_config())
        micro_batch_size = self.loop_settings.train_batch_size if self._loop_settings_connected else None
        config = reconcile(
            base,
            user_given=self.user_config is not None,
            precision_name=self.precision.name,
            device_type=self.accelerator.device_type,
            loop_settings=self.loop_settings if self._loop_settings_connected else None,
            micro_batch_size=micro_batch_size or self._lightning.logging_batch_size_per_gpu,
            world_size=self.num_processes * self.num_nodes,
        )
        config = self._lightning.apply_loss_scaling(config, self.precision.name)
        if self.accelerator.device_type != "cpu":
            if self.user_config is None:
                config = gpu_sizes(config)
        elif self._largest_parameter is not None:
            config = fitted_sizes(config, self._largest_parameter)
        self._config = config

    @property
    def config(self) -> dict[str, Any]:
        """The DeepSpeed config this run uses (the options or the user's, reconciled with the Trainer)."""
        if self._config is None:
            raise RuntimeError("DeepSpeedStrategy has no config yet; create it with stratagem.resolve().")
        return self._config

    @property
    def supplies_optimizer(self) -> bool:
        # The config's 'optimizer' section: the engine builds that optimizer when given none.
        config = self._config if self._config is not None else (self.user_config or {})
        return "optimizer" in config

    @property
    def zero_stage(self) -> int:
        return zero_stage(self.config)

    def estimate_memory(self, footprint: ModelFootprint) -> MemoryEstimate:
        config = self.config
        if self.accelerator.device_type == "cpu":
            if footprint.module is not None:
                largest = largest_parameter_elements(footprint.module.parameters())
            else:
                # Without the module, the largest block bounds its largest parameter.
                largest = footprint.largest_unit_bytes * footprint.parameters // max(1, footprint.parameter_bytes)
            config = fitted_sizes(config, largest)
        estimate = deepspeed_estimate(footprint, config, self.world_size)
        if self.releases_host_memory:
            estimate = replace(estimate, relative_step_time=estimate.relative_step_time * RELEASING_STEP_TIME)
        return estimate

    def layout_sharding(self, devices_per_node: int) -> LayoutSharding:
        # Unconfigured: the config as the options or the user's file give it, before the Trainer's values join.
        if self.user_config is not None:
            config = upgrade_boolean_offload(self.user_config)
        else:
            config = self._lightning.apply(self.options.to_config())
        return zero_layout_sharding(config)

    @property
    def releases_host_memory(self) -> bool:
        """Whether each rank has the allocator return freed tensors' memory at once (``release_host_memory``):
        by default on the CPU accelerator, where the engine's memory is host memory and the heap otherwise keeps
        what every step frees (see :func:`stratagem.strategies.release_freed_host_memory`)."""
        return releases_host_memory(self._release_host_memory, self.accelerator.device_type)

    @property
    def checkpoint_io(self) -> CheckpointIO:
        if self._checkpoint_io is None:
            self._checkpoint_io = DeepSpeedCheckpointIO()
        return self._checkpoint_io

    @checkpoint_io.setter
    def checkpoint_io(self, checkpoint_io: CheckpointIO) -> None:
        self._checkpoint_io = checkpoint_io

    @property
    def checkpoint_written_by_every_rank(self) -> bool:
        # The engine writes every rank's ZeRO shards itself, whatever the checkpoint IO declares.
        return True

    def checkpoint_io_problem(self, checkpoint_io: CheckpointIO) -> str | None:
        if isinstance(checkpoint_io, DeepSpeedCheckpointIO):
            return None
        return (
            "DeepSpeed's engine writes its checkpoints itself (every rank its ZeRO shards, in DeepSpeed's directory "
            "layout), so a checkpoint IO would never be called to save. Leave it out of plugins= and the strategy's "
            "checkpoint_io=; the directories it writes load into any strategy."
        )

    # -- lifecycle (in every worker) ------------------------------------------------------------

    def setup_environment(self) -> None:
        # DeepSpeed reads its rank from the environment, whatever started this process.
        environment = self._environment
        self._set_world_ranks()
        os.environ.update(
            {
                "RANK": str(environment.global_rank()),
                "LOCAL_RANK": str(environment.local_rank()),
                "WORLD_SIZE": str(environment.world_size()),
            }
        )
        super().setup_environment()
        if self.releases_host_memory:
            release_freed_host_memory()
        deepspeed = import_deepspeed()
        deepspeed.utils.logging.logger.setLevel(self.logging_level)
        deepspeed.init_distributed(dist_backend=self.process_group_backend, timeout=self.timeout)

    @contextlib.contextmanager
    def module_init_context(self, empty_init: bool | None = None) -> Iterator[None]:
        if self.zero_stage != 3:
            with super().module_init_context(empty_init):
                yield
            return
        # Rank 0 builds the module eagerly and setup_module partitions rank 0's values (see rank_zero_partition for
        # why not inside zero.Init). With weights to load rank 0 skips the random draws; the buffers it computes
        # (Llama's rotary inv_freq) are in no checkpoint, so they are built in every case.
        self._built_on_rank_zero = True
        with contextlib.ExitStack() as stack:
            stack.enter_context(rank_zero_build(self.is_global_zero))
            stack.enter_context(self.precision.module_init_context())
            if empty_init:
                stack.enter_context(skip_parameter_init())
            yield

    def _zero_init(self) -> Any:
        zero_init = import_deepspeed().zero.Init(
            config_dict_or_path=self.config, remote_device=self.remote_device, enabled=True
        )
        if zero_init.param_swapper is not None:
            self._nvme_swappers.append(zero_init.param_swapper)
        return zero_init

    def setup_module(self, module: nn.Module) -> nn.Module:
        if self._built_on_rank_zero:
            self._built_on_rank_zero = False
            refuse_differently_built(module)
            partition_from_rank_zero(module, self._zero_init(), self.root_device)
            refuse_meta_attributes(module)
        # The engine is built with the optimizer (setup_optimizers); until then the module runs as is.
        self._module = self._model = module
        # A swapper configure_model put nothing on (the module was built before the run) is freed now, not at the end.
        self._release_nvme_swappers(released=[])
        return module

    def setup_optimizers(self, optimizers: list[Optimizer]) -> list[Optimizer]:
        optimizers = super().setup_optimizers(optimizers)
        has_config_optimizer = "optimizer" in self.config
        if optimizers and has_config_optimizer:
            raise ValueError(
                f"Two optimizers were given: configure_optimizers returned {type(optimizers[0]).__name__} and the "
                f"DeepSpeed config has an 'optimizer' section ({self.config['optimizer'].get('type')!r}). DeepSpeed "
                "takes one: return nothing from configure_optimizers, or remove 'optimizer' from the config."
            )
        if not optimizers and not has_config_optimizer:
            raise ValueError(
                "DeepSpeed needs an optimizer: return one from configure_optimizers, or add an 'optimizer' section "
                "to the DeepSpeed config."
            )
        client_optimizer = optimizers[0] if optimizers else None
        self._largest_parameter = largest_parameter_elements(self.module.parameters())
        self._reconcile()
        if client_optimizer is not None:
            self._warn_about_slow_offloaded_optimizer(client_optimizer)
            # DeepSpeed replaces the groups' parameters by flat partitions; a plain optimizer state
            # numbers parameters in this original order.
            self._parameter_groups = [list(group["params"]) for group in client_optimizer.param_groups]
        else:
            self._parameter_groups = [[p for p in self.module.parameters() if p.requires_grad]]
        deepspeed = import_deepspeed()
        engine, _, _, _ = deepspeed.initialize(
            model=self.module,
            optimizer=client_optimizer,
            model_parameters=None if client_optimizer else [p for p in self.module.parameters() if p.requires_grad],
            config=self.config,
            dist_init_required=False,
        )
        self._engine = engine
        self._model = engine
        configure_activation_checkpointing(self.config)
        # The torch optimizer the engine steps: schedulers and the Trainer see its param_groups, while
        # backward and step go through the engine (which wraps it in ZeRO's partitioned optimizer).
        return [engine.basic_optimizer]

    def _warn_about_slow_offloaded_optimizer(self, optimizer: Optimizer) -> None:
        if "optimizer" not in offload_devices(self.config) or not self.is_global_zero:
            return
        if isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW):
            warnings.warn(
                f"The optimizer state is offloaded, so {type(optimizer).__name__}.step runs on the CPU in plain "
                "PyTorch. deepspeed.ops.adam.DeepSpeedCPUAdam (adamw_mode=True for AdamW) computes the same step "
                "several times faster; create it in configure_optimizers instead.",
                UserWarning,
                stacklevel=2,
            )

    def run_step(self, step_name: str, *args: Any) -> Any:
        if self._engine is None:
            # Evaluation without fit: no optimizer, but stage 3 still needs the engine to gather parameters.
            self._initialize_inference_engine()
        return super().run_step(step_name, *args)

    def _initialize_inference_engine(self) -> None:
        config = {key: value for key, value in self.config.items() if key not in ("optimizer", "scheduler")}
        if self.zero_stage == 3:
            zero = dict(config["zero_optimization"])
            zero.pop("offload_optimizer", None)
        else:
            # Stages 1 and 2 shard only optimizer state and gradients, which evaluation has none of.
            zero = {"stage": 0}
        config["zero_optimization"] = zero
        engine, _, _, _ = import_deepspeed().initialize(model=self.module, config=config, dist_init_required=False)
        self._engine = engine
        self._model = engine
        configure_activation_checkpointing(self.config)

    @property
    def engine(self) -> DeepSpeedEngine:
        """The DeepSpeed engine wrapping the module (after :meth:`setup_optimizers`)."""
        if self._engine is None:
            raise RuntimeError("The DeepSpeed engine is created by setup_optimizers(), which has not run yet.")
        return self._engine

    def check_lr_schedulers(self, schedulers: list[Any]) -> None:
        super().check_lr_schedulers(schedulers)
        if schedulers and "scheduler" in self.config:
            raise ValueError(
                f"Two learning-rate schedulers were given: configure_optimizers returned "
                f"{type(schedulers[0]).__name__} and the DeepSpeed config has a 'scheduler' section "
                f"({self.config['scheduler'].get('type')!r}), which the engine steps itself. Keep one: return no "
                "scheduler from configure_optimizers, or remove 'scheduler' from the config."
            )

    def set_accumulation_boundary(self, is_boundary: bool) -> None:
        # Set on every batch, so the engine never falls back to its own micro-step count, which an
        # epoch that ends mid-window would put out of step with the Trainer's optimizer steps.
        self.engine.set_gradient_accumulation_boundary(is_boundary)

    def backward(self, loss: torch.Tensor, optimizer: Optimizer | None) -> None:
        # The engine scales by 1/accumulation itself, applies loss scaling and reduces gradients.
        self.engine.backward(loss)

    def optimizer_step(self, optimizer: Optimizer) -> Any:
        # Called on every micro-batch; the engine steps, clips and zeroes only on the accumulation boundary.
        return self.engine.step()

    def zero_grad(self, optimizer: Optimizer) -> None:
        """The engine zeroes gradients after its own step; zeroing here would drop accumulated micro-batches."""

    def clip_gradients(
        self, optimizer: Optimizer, clip_val: float, algorithm: Literal["norm", "value"] = "norm"
    ) -> torch.Tensor | None:
        configured = float(self.config.get("gradient_clipping", 0.0))
        if algorithm != "norm" or float(clip_val) != configured:
            raise ValueError(
                f"DeepSpeed clips inside its engine step, with the configured gradient_clipping={configured}; "
                f"clip_gradients(clip_val={clip_val}, algorithm={algorithm!r}) cannot change that. Pass "
                "gradient_clip_val to the Trainer (or gradient_clipping in the config) instead."
            )
        return None

    # -- checkpoints ----------------------------------------------------------------------------

    def save_checkpoint(self, path: PathLike, state: dict[str, Any]) -> None:
        """Every rank writes its ZeRO shards through the engine into a staged directory; once all are written,
        rank 0 adds the plain entries and publishes it under ``path`` (:mod:`stratagem.checkpoint_io.staging`)."""
        if self._engine is None and not _holds_partitions(state):
            self._save_after_run(path, state)
            return
        if self._engine is None:
            raise RuntimeError(
                f"DeepSpeedStrategy cannot save_checkpoint({str(path)!r}) now: the DeepSpeed engine that holds the "
                "ZeRO state exists only during a run (it is released at its end). Save while the run is live: call "
                "trainer.save_checkpoint(path) from a callback or hook (on_train_end, say), or let ModelCheckpoint "
                "save."
            )
        target = Path(path).absolute()
        module_key, optimizers_key, plain = self._split_state(state)
        full_weights = self.module_full_state_dict() if self.save_full_weights else None
        metadata = {
            "module_key": module_key,
            "optimizers_key": optimizers_key,
            "world_size": self.world_size,
            "zero_stage": self.zero_stage,
        }
        entries = {**plain, layout.METADATA_KEY: metadata}
        if full_weights is not None:
            entries[module_key] = full_weights

        def write_shards(staging: Path) -> None:
            # DeepSpeed would save optimizer sub-groups swapped out to NVMe as empty tensors.
            with swapped_optimizer_state_in_memory(self.engine.optimizer):
                self.engine.save_checkpoint(str(staging))

        write_staged(target, self, write_shards, lambda staging: layout.write_state_file(staging, entries))

    def _save_after_run(self, path: PathLike, state: dict[str, Any]) -> None:
        """``trainer.save_checkpoint`` once the run has ended (no engine, no ZeRO-3 partitions left): its optimizer
        state went with the engine, but teardown left every rank the whole module (stage 3 gathers it back). Rank 0
        writes the module and the plain entries as a directory every reader takes; the other ranks write nothing."""
        if not self.is_global_zero:
            return
        entries: dict[str, Any] = {}
        metadata: dict[str, Any] = {
            "optimizers_key": None,
            "world_size": self.world_size,
            "zero_stage": self.zero_stage,
        }
        for key, value in state.items():
            if isinstance(value, nn.Module):
                metadata["module_key"] = key
                entries[key] = {name: tensor.detach().cpu() for name, tensor in value.state_dict().items()}
            elif _is_optimizers(value):
                warnings.warn(
                    f"save_checkpoint({str(path)!r}) after the run holds the module's weights and the loop state, but "
                    "no optimizer state: DeepSpeed's optimizer state went with the run's engine. Resuming from it "
                    "starts a fresh optimizer; for a checkpoint that resumes exactly, save during the run "
                    "(ModelCheckpoint, or trainer.save_checkpoint in on_train_end).",
                    UserWarning,
                    stacklevel=3,
                )
            else:
                entries[key] = value
        if "module_key" not in metadata:
            raise ValueError("save_checkpoint: state has no module; pass {'module': module, ...}.")
        DeepSpeedCheckpointIO().save_checkpoint({**entries, layout.METADATA_KEY: metadata}, path)

    def _split_state(self, state: dict[str, Any]) -> tuple[str, str | None, dict[str, Any]]:
        module_key = None
        optimizers_key = None
        plain = {}
        for key, value in state.items():
            if isinstance(value, nn.Module):
                if value is not self.module and value is not self._model:
                    raise ValueError(
                        f"save_checkpoint: state[{key!r}] is a module this strategy did not set up; DeepSpeed saves "
                        "only the module of its engine."
                    )
                module_key = key
            elif _is_optimizers(value):
                optimizers_key = key
            else:
                plain[key] = value
        if module_key is None:
            raise ValueError("save_checkpoint: state has no module; pass {'module': module, ...}.")
        return module_key, optimizers_key, plain

    def load_checkpoint(
        self, path: PathLike, state: dict[str, Any], strict: bool = True, weights_only: bool = True
    ) -> dict[str, Any]:
        directory = Path(path)
        self._refuse_loading_into_swapped_optimizer_state(path)
        if self._resumable(directory, weights_only):
            return self._resume(directory, state, strict, weights_only)
        return self._load_full_weights(directory, state, strict, weights_only)

    def _refuse_loading_into_swapped_optimizer_state(self, path: PathLike) -> None:
        # DeepSpeed 0.19.8 loads neither the weights nor the optimizer state of a sub-group swapped out to NVMe:
        # the run would go on from its initial weights. ZeRO-3 partitions, and so what is swapped, are alike
        # on every rank, so every rank decides alike.
        if self._engine is None or self.engine.optimizer is None:
            return
        swapped = swapped_optimizer_sub_groups(self.engine.optimizer)
        if swapped:
            raise RuntimeError(
                f"DeepSpeedStrategy cannot load_checkpoint({str(path)!r}) into this run: {len(swapped)} of the "
                f"optimizer's {len(self.engine.optimizer.fp16_groups)} sub-groups are swapped out to NVMe, and "
                "DeepSpeed loads neither their weights nor their optimizer state (training would go on from the "
                "initial weights). Nothing was loaded. Resume with the optimizer offloaded to the CPU "
                "(offload_optimizer_device='cpu', e.g. 'deepspeed_stage_3_offload'; parameters may stay on NVMe), "
                "which reads this checkpoint whole."
            )

    def _resumable(self, directory: Path, weights_only: bool) -> bool:
        """Whether DeepSpeed's engine can load ``directory`` as it is: same layout, stage and world size."""
        if self._engine is None or not layout.is_deepspeed_checkpoint(directory):
            return False
        tag = layout.read_tag(directory)
        if tag is None:
            return False
        metadata = read_state_file(directory, weights_only=weights_only).get(layout.METADATA_KEY, {})
        saved_stage = metadata.get("zero_stage", self.zero_stage)
        return saved_stage == self.zero_stage and layout.shard_world_size(directory, tag) == self.world_size

    def _resume(self, directory: Path, state: dict[str, Any], strict: bool, weights_only: bool) -> dict[str, Any]:
        from stratagem_deepspeed.shards import check_shard_files

        tag = layout.read_tag(directory)
        assert tag is not None
        check_shard_files(directory, tag, weights_only)
        self._refuse_universal_load_of_a_plain_checkpoint(directory, tag)
        entries = read_state_file(directory, weights_only=weights_only)
        metadata = entries.pop(layout.METADATA_KEY, {})
        wants_optimizer = any(_is_optimizers(value) for value in state.values())
        loaded, _ = self.engine.load_checkpoint(
            str(directory),
            tag=tag,
            load_module_strict=strict,
            load_optimizer_states=wants_optimizer,
            load_lr_scheduler_states=wants_optimizer,
            load_module_only=not wants_optimizer,
        )
        if loaded is None:
            raise RuntimeError(f"DeepSpeed could not load the checkpoint {str(directory)!r} (tag {tag!r}).")
        entries.pop(metadata.get("module_key", "module"), None)
        for key, value in state.items():
            if not isinstance(value, nn.Module) and not _is_optimizers(value):
                continue
            entries.pop(key, None)
        return entries

    def _refuse_universal_load_of_a_plain_checkpoint(self, directory: Path, tag: str) -> None:
        # DeepSpeed's universal loader reads <tag>/zero/, which only ds_to_universal writes; on a plain ZeRO
        # checkpoint it fails with a bare AssertionError on every rank.
        if not self.config.get("checkpoint", {}).get("load_universal"):
            return
        if optional_checkpoint_file(directory, f"{tag}/zero/optimizer_state.pt") is None:
            raise CheckpointError(
                f"The DeepSpeed config sets checkpoint.load_universal, but {str(directory)!r} is not a universal "
                f"checkpoint ({tag}/zero/optimizer_state.pt is missing); nothing was loaded. Remove load_universal "
                "(stratagem resumes a plain ZeRO checkpoint at any stage and world size itself), or convert the "
                "checkpoint with DeepSpeed's ds_to_universal first."
            )

    def _load_full_weights(
        self, directory: Path, state: dict[str, Any], strict: bool, weights_only: bool
    ) -> dict[str, Any]:
        from stratagem.checkpoint_io.readers import read_full_checkpoint

        checkpoint = read_full_checkpoint(
            directory,
            self.checkpoint_io,
            weights_only=weights_only,
            required=[key for key, target in state.items() if isinstance(target, nn.Module)],
        )
        remaining = LazyCheckpoint.shallow_copy(checkpoint)
        for key, target in state.items():
            if isinstance(target, nn.Module):
                load_module_state(self.module, strip_compile_prefix(remaining.pop(key)), strict)
            elif _is_optimizers(target):
                saved = remaining.pop(key, None)
                # Optimizer state swapped to NVMe exists only in DeepSpeed's own swap files.
                swapped = self._optimizer_state_on_nvme
                if saved and self._engine is not None and self.engine.optimizer is not None and not swapped:
                    load_optimizer_state(self.engine, self._parameter_groups, saved[0])
                elif self.is_global_zero:
                    warnings.warn(
                        f"{str(directory)!r} holds no optimizer state this run can take: the module's weights are "
                        "loaded, and training resumes with fresh optimizer state.",
                        UserWarning,
                        stacklevel=3,
                    )
        return remaining

    def load_pretrained(self, target: nn.Module, weights: SafetensorsWeights) -> None:
        # A partitioned (ZeRO-3) parameter is gathered alone, filled by rank 0 and partitioned again by DeepSpeed:
        # one whole tensor at a time, never the whole model.
        deepspeed = import_deepspeed()

        def copy(name: str, tensor: torch.Tensor, weights: SafetensorsWeights) -> None:
            if not hasattr(tensor, "ds_id"):
                copy_whole(name, tensor, weights)
                return
            with deepspeed.zero.GatheredParameters([tensor], modifier_rank=0):
                if self.is_global_zero:
                    tensor.copy_(weights.read(name))

        load_pretrained_weights(target, weights, copy, _whole_shape)

    def module_full_state_dict(self) -> dict[str, Any]:
        full = gather_module_state(self.module)
        return full if self.is_global_zero else {}

    def teardown(self) -> None:
        released: list[nn.Parameter] = []
        if self._engine is not None and self.zero_stage == 3:
            released = [parameter for parameter in self.module.parameters() if hasattr(parameter, "ds_id")]
            self._drop_optimizer_state()
            # Whole again for the caller and for the next run in this process (test after fit), whose
            # process group the old partitions do not know.
            release_partitioned_parameters(self.module)
        if self._engine is not None:
            self._engine.destroy()
        self._engine = None
        self._release_nvme_swappers(released)
        super().teardown()

    def _drop_optimizer_state(self) -> None:
        """Free the optimizer's per-element state (AdamW's moments) before the whole module is gathered: the
        engine ends with this run, so nothing reads it again, and its memory makes room for the full weights.
        Swapped (NVMe) state is left to its swapper."""
        if self._optimizer_state_on_nvme:
            return
        inner = getattr(getattr(self._engine, "optimizer", None), "optimizer", None)
        if isinstance(inner, Optimizer):
            inner.state.clear()

    @property
    def _optimizer_state_on_nvme(self) -> bool:
        return offload_devices(self.config).get("optimizer") == "nvme"

    def _release_nvme_swappers(self, released: list[nn.Parameter]) -> None:
        """Free the buffers of every NVMe swapper this run made that no partitioned parameter of the module
        still uses; ``released`` are the partitioned parameters the module no longer holds."""
        module = self._module
        live = (
            [parameter for parameter in module.parameters() if hasattr(parameter, "ds_id")]
            if module is not None
            else []
        )
        in_use = {id(swapper) for swapper in swappers_of(live)}
        for swapper in swappers_of(released) + self._nvme_swappers:
            if id(swapper) not in in_use:
                release_swap_buffers(swapper, released)
        self._nvme_swappers = [swapper for swapper in self._nvme_swappers if id(swapper) in in_use]

    def destroy_process_group(self) -> None:
        comm = sys.modules.get("deepspeed.comm")
        if comm is None or not comm.is_initialized():
            # Setup failed before DeepSpeed joined the group: it holds nothing of it.
            super().destroy_process_group()
            return
        # Through deepspeed.comm, so that DeepSpeed also drops the groups it cached (its clone of the world
        # group, sequence- and expert-parallel groups, mpu); the next run's engine would otherwise use them
        # after they died with this group ("Group ... is not registered").
        comm.destroy_process_group()

    def __repr__(self) -> str:
        return (
            f"DeepSpeedStrategy(stage={self.options.stage if self._config is None else self.zero_stage}, "
            f"devices={self.num_processes}, num_nodes={self.num_nodes})"
        )


def _whole_shape(tensor: torch.Tensor) -> tuple[int, ...]:
    return tuple(getattr(tensor, "ds_shape", tensor.shape))


def _holds_partitions(state: dict[str, Any]) -> bool:
    """Whether a module in ``state`` still holds ZeRO-3 partitions (the run set it up and has not ended)."""
    return any(
        hasattr(parameter, "ds_id")
        for value in state.values()
        if isinstance(value, nn.Module)
        for parameter in value.parameters()
    )


def _is_optimizers(value: Any) -> bool:
    return isinstance(value, Optimizer) or is_optimizer_list(value)
