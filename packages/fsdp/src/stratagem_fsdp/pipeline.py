"""PipelineStrategy: the model cut into stages over the ``"pp"`` ranks of the mesh, run by a torch schedule,
each stage fully sharded over its data-parallel ranks or split over its tensor-parallel ones."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh
from torch.optim import Optimizer

from stratagem.checkpoint_io import LazyCheckpoint, read_full_checkpoint
from stratagem.checkpoint_io.optimizer_state import parameter_names, to_name_keyed
from stratagem.mesh import Degree, MeshLayout
from stratagem.pipelining.engine import PipelineEngine
from stratagem.pipelining.memory import PipelineShape, pipeline_estimate
from stratagem.pipelining.schedules import check_schedule, rank_stages, schedule_kind
from stratagem.pipelining.split import StageSplit, split_module
from stratagem.pipelining.stage_modules import hand_out_stages, holder_pairs, keep_stages, stage_view
from stratagem.pipelining.windows import BatchWindows
from stratagem.strategies import (
    ChecksModuleBeforeLaunch,
    EngineSteps,
    LoaderStage,
    LoopSettings,
    MemoryEstimate,
    ModelFootprint,
    OwnsTrainingStep,
    RebuildsDataLoaders,
    Strategy,
    skip_parameter_init,
)
from stratagem.strategies.compilation import strip_compile_prefix
from stratagem.strategies.gradient_norm import clip_gradients_by_norm
from stratagem.strategies.rank_zero_build import rank_zero_build, refuse_differently_built
from stratagem_fsdp.model_parallel import ModelParallelStrategy
from stratagem_fsdp.options import mixed_precision_policy
from stratagem_fsdp.tp_plan import apply_tp_plan, check_heads_split_evenly, check_plan_matches, plan_entries_present

_LOSS_HOOK = "pipeline_loss"
_BATCH_HOOK = "pipeline_batch"


class PipelineStrategy(ModelParallelStrategy, OwnsTrainingStep, RebuildsDataLoaders, ChecksModuleBeforeLaunch):
    """Pipeline parallelism: the module cut into stages, one (or several) per ``"pp"`` rank, trained by a schedule
    of ``torch.distributed.pipelining`` over micro-batches; composed with ``fully_shard`` of each stage over its
    ``"dp_shard"`` ranks (``dp_replicate`` for HSDP) on one mesh, ``pp`` outermost.

    The module is cut along one ``nn.ModuleList`` of blocks (see :mod:`stratagem.pipelining.split`): what is
    declared before the list (embeddings) goes to the first stage, what after it (norm, head) to the last.
    Its ``forward`` must skip the pieces a stage does not hold, which are ``None`` there::

        def forward(self, x):
            if self.embed is not None:
                x = self.embed(x)
            for layer in self.layers:
                x = layer(x)
            return self.head(x) if self.head is not None else x

    Training runs the schedule on ``(inputs, target)`` batches (or what ``pipeline_batch(batch)`` returns) with
    ``module.pipeline_loss(output, target)`` on the last stage, a mean per micro-batch; the strategy then clips
    and steps the optimizers (:class:`OwnsTrainingStep`). With ``accumulate_grad_batches=k`` the training data
    is read ``k`` batches at a time (:class:`RebuildsDataLoaders`), one schedule call over all their
    micro-batches. ``validation_step``, ``test_step`` and ``predict_step`` run as written: ``self(x)`` inside
    them runs the stages forward only, over the batch's micro-batches, and gives every rank the model's output,
    so ``self.log`` works on every rank.

    Options:

    - ``pp``: pipeline ranks (``-1`` by default: the ranks ``dp_replicate`` and ``dp_shard`` leave);
    - ``pipeline_schedule``: a name of :data:`stratagem.pipelining.SCHEDULES` (``"1f1b"`` by default);
    - ``micro_batches`` (default ``pp``) or ``micro_batch_size``: how each batch is cut;
    - ``stages_per_rank``: stages each rank holds, for the interleaved schedules (default 2);
    - ``pipeline_split``: the first block of every stage after the first (``["layers.4"]``); by default the
      blocks are divided evenly. ``pipeline_blocks`` names the block list where the largest is not the one;
    - ``log_loss_as``: the name the step's loss is logged under on every rank (``"train_loss"``; ``None``: not
      logged), for the progress bar and ``ModelCheckpoint(monitor=...)``, since ``training_step`` does not run;
    - ``dp_replicate``, ``dp_shard`` (default 1); FSDP's options for how each stage is sharded;
    - ``tp`` (default 1) with ``tp_plan`` (:mod:`stratagem_fsdp.tp_plan`, for the whole model): each rank splits
      the modules of its stages that the plan names over its ``"tp"`` ranks, after the cut; not yet together
      with ``dp_replicate`` or ``dp_shard``.

    Checkpoints are sharded (``torch.distributed.checkpoint``): every rank writes its stage under the whole
    model's names, so that any strategy and layout reads them.
    """

    mesh_dimensions: ClassVar[frozenset[str]] = frozenset({"pp", "dp_replicate", "dp_shard", "tp"})

    def __init__(
        self,
        *,
        pp: Degree = -1,
        pipeline_schedule: str = "1f1b",
        micro_batches: int | None = None,
        micro_batch_size: int | None = None,
        stages_per_rank: int | None = None,
        pipeline_split: Sequence[str] | None = None,
        pipeline_blocks: str | None = None,
        log_loss_as: str | None = "train_loss",
        dp_replicate: Degree = 1,
        dp_shard: Degree = 1,
        tp: Degree = 1,
        **options: Any,
    ) -> None:
        if options.get("state_dict_type", "sharded") != "sharded":
            raise ValueError(
                f"state_dict_type={options['state_dict_type']!r} cannot work with the pipeline strategy: no rank "
                "holds the whole model. It saves sharded checkpoints (every stage its part), which every strategy "
                "and layout reads, single_device included."
            )
        super().__init__(dp_replicate=dp_replicate, dp_shard=dp_shard, tp=tp, **options)
        self._mesh_layout = MeshLayout(dp_replicate, dp_shard, tp, pp=pp)
        # Sizes left at their defaults give way to a layout= given to resolve (or the Trainer).
        self._layout_given = self._mesh_layout != MeshLayout(pp=-1, dp_shard=1)
        schedule_kind(pipeline_schedule)
        if micro_batches is not None and micro_batch_size is not None:
            raise ValueError(
                f"micro_batches={micro_batches} and micro_batch_size={micro_batch_size}: give one, the count of "
                "micro-batches per batch or their size."
            )
        for name, value in (("micro_batch_size", micro_batch_size), ("micro_batches", micro_batches)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name}={value!r} is not valid; expected a positive int.")
        self.pipeline_schedule = pipeline_schedule
        self.micro_batch_size = micro_batch_size
        self._micro_batches = micro_batches
        self._stages_per_rank_option = stages_per_rank
        self.stages_per_rank = 1
        self.pipeline_split = None if pipeline_split is None else list(pipeline_split)
        self.pipeline_blocks = pipeline_blocks
        self.log_loss_as = log_loss_as
        self._split: StageSplit | None = None
        self._engine: PipelineEngine | None = None
        self._views: list[nn.Module] = []
        self._whole_model_order: list[str] = []

    # -- configuration (in the calling process) ---------------------------------------------

    def complete_configuration(self) -> None:
        super().complete_configuration()
        layout = self._resolved_layout
        if int(layout.tp) > 1 and self.tp_plan is None:
            raise ValueError(
                f"tp={layout.tp} with the pipeline strategy needs tp_plan= (e.g. {{'layers.*.up': 'colwise', "
                "'layers.*.down': 'rowwise'}): the stages are cut in setup_module, after configure_model, so the "
                "strategy splits each stage's modules over the 'tp' ranks by the plan."
            )
        if int(layout.tp) > 1 and layout.data_parallel_size > 1:
            raise ValueError(
                f"pp={layout.pp} x tp={layout.tp} x dp_replicate={layout.dp_replicate} x dp_shard={layout.dp_shard}: "
                "the pipeline strategy composes tp or data parallelism with pp, not both yet. Use dp_replicate=1 "
                "and dp_shard=1 with tp, or tp=1."
            )
        if getattr(self.precision, "scaler", None) is not None:
            raise ValueError(
                "precision='16-mixed' scales the loss with a gradient scaler, which the pipeline's schedule (running "
                "backward itself) cannot apply. Use precision='bf16-mixed' or '32-true'."
            )
        self.stages_per_rank = check_schedule(
            self.pipeline_schedule, self.pp, self._stages_per_rank_option, self.micro_batches
        )

    def estimate_memory(self, footprint: ModelFootprint) -> MemoryEstimate:
        layout = self._resolved_layout
        shape = PipelineShape(
            schedule_kind(self.pipeline_schedule),
            self.pp,
            self.stages_per_rank,
            self.micro_batches,
            int(layout.dp_shard),
        )
        split = None
        if footprint.module is not None:
            split = split_module(footprint.module, self.num_stages, self.pipeline_split, self.pipeline_blocks)
        return pipeline_estimate(footprint, shape, split)

    @property
    def pp(self) -> int:
        """Pipeline ranks (``-1`` until configured for a world size)."""
        return int(self._resolved_layout.pp)

    @property
    def num_stages(self) -> int:
        return self.pp * self.stages_per_rank

    @property
    def micro_batches(self) -> int:
        """Micro-batches per batch: as given, from ``micro_batch_size`` once the batch size is known, else ``pp``."""
        if self._micro_batches is not None:
            return self._micro_batches
        size = self.loop_settings.train_batch_size
        if self.micro_batch_size is not None and size is not None:
            return max(1, size // self.micro_batch_size)
        return max(1, self.pp)

    def connect_loop_settings(self, settings: LoopSettings) -> None:
        super().connect_loop_settings(settings)
        size = settings.train_batch_size
        if size is not None:
            self._check_batch_size(size)
        if self._mesh_layout is not None and self.pp > 0:
            check_schedule(self.pipeline_schedule, self.pp, self._stages_per_rank_option, self.micro_batches)

    def _check_batch_size(self, size: int) -> None:
        if self.micro_batch_size is not None and size % self.micro_batch_size:
            raise ValueError(
                f"The training batch size {size} (per data-parallel rank) is not divisible into micro-batches of "
                f"micro_batch_size={self.micro_batch_size}. Use a batch size that is a multiple of it."
            )
        if self._micro_batches is not None and size % self._micro_batches:
            raise ValueError(
                f"The training batch size {size} (per data-parallel rank) is not divisible into "
                f"micro_batches={self._micro_batches}. Use a batch size that is a multiple of {self._micro_batches}, "
                "or another micro_batches."
            )

    def check_module(self, module: Any, stage: LoaderStage) -> None:
        if stage == "fit" and not callable(getattr(module, _LOSS_HOOK, None)):
            raise TypeError(
                f"{type(module).__name__} has no {_LOSS_HOOK}(output, target): the pipeline strategy computes the loss "
                "on the last stage, per micro-batch, with it. Define it (the loss training_step would compute)."
            )
        if self._split is not None and module is self._module:
            return  # Cut into stages by an earlier run in this process (fit, then validate): checked then.
        if any(True for _ in module.parameters()):
            split_module(module, self.num_stages, self.pipeline_split, self.pipeline_blocks)

    # -- set-up (in every worker) -----------------------------------------------------------

    @contextlib.contextmanager
    def module_init_context(self, empty_init: bool | None = None) -> Iterator[None]:
        # Rank 0 builds the whole module eagerly (the values one process would draw), the others on the meta
        # device; setup_module then gives every rank its stages with rank 0's values.
        if empty_init is False:
            with Strategy.module_init_context(self, empty_init):
                yield
            return
        with contextlib.ExitStack() as stack:
            stack.enter_context(rank_zero_build(self.is_global_zero))
            stack.enter_context(self.precision.module_init_context())
            if empty_init:
                stack.enter_context(skip_parameter_init())
            yield

    def setup_module(self, module: nn.Module) -> nn.Module:
        if self._split is not None and module is self._module:
            # Set up before in this process (fit, then test): it holds its stages already, on a new process group.
            self._engine = self._make_engine()
            return module
        refuse_differently_built(module)
        split = split_module(module, self.num_stages, self.pipeline_split, self.pipeline_blocks)
        if self.tp_plan is not None:
            check_plan_matches(module, self.tp_plan)
        self._whole_model_order = [name for name, _ in module.named_parameters()]
        layout = self._resolved_layout
        kind = schedule_kind(self.pipeline_schedule)

        def stages_of(rank: int) -> list[int]:
            return rank_stages(kind, layout.pipeline_rank(rank), self.pp, self.stages_per_rank)

        hand_out_stages(module, split, stages_of, self.root_device)
        module = self.precision.convert_module(module).to(self.root_device)
        if self.tp_plan is not None:
            # Split after the cut: each rank splits what its stages hold (rank 0's values) over its 'tp' ranks.
            apply_tp_plan(module, self.device_mesh["tp"], plan_entries_present(module, self.tp_plan))
            check_heads_split_evenly(module, int(layout.tp))
        own = stages_of(self.global_rank)
        self._views = [stage_view(module, split, stage) for stage in own]
        if layout.data_parallel_size > 1:
            for view, stage in zip(self._views, own, strict=True):
                self._shard_stage(module, view, split, stage)
        self._split = split
        self._module = self._model = module
        self._engine = self._make_engine()
        return module

    def _shard_stage(
        self,
        module: nn.Module,
        view: nn.Module,
        split: StageSplit,
        stage: int,
        mesh: DeviceMesh | None = None,
        kwargs: dict[str, Any] | None = None,
    ) -> None:
        """``fully_shard`` each block and end piece of a stage, then the stage itself, over the data ranks (the
        run's mesh and ``fully_shard`` arguments unless given)."""
        from torch.distributed.fsdp import fully_shard

        if kwargs is None:
            kwargs = {
                "mp_policy": mixed_precision_policy(self.mixed_precision, self.precision),
                "offload_policy": self._configured_offload_policy,
                **self._fully_shard_kwargs,
            }
        mesh = self._sharding_mesh if mesh is None else mesh
        for piece in split.pieces(stage):
            submodule = _submodule_or_none(view, piece)
            if submodule is not None and any(True for _ in submodule.parameters()):
                fully_shard(submodule, mesh=mesh, **kwargs)
        fully_shard(view, mesh=mesh, **{**kwargs, "reshard_after_forward": False})
        # The stage's own tensors (those its holders keep directly) were sharded on the view's copies of the
        # holders: the module the optimizer steps must hold the same (sharded) parameters.
        for holder, view_holder in holder_pairs(module, view, split):
            for name, parameter in view_holder._parameters.items():
                if parameter is not None:
                    holder._parameters[name] = parameter

    def rehearse_setup(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        # setup_module's cut on the rehearsal's mesh: this rank keeps its stages, each fully sharded over the data
        # ranks. Rank 0's values, the precision's casts and the offload policy move tensors: they are left out.
        pp = device_mesh["pp"].size()
        micro_batches = self._micro_batches if self._micro_batches is not None else max(1, pp)
        stages_per_rank = check_schedule(self.pipeline_schedule, pp, self._stages_per_rank_option, micro_batches)
        split = split_module(module, pp * stages_per_rank, self.pipeline_split, self.pipeline_blocks)
        own = rank_stages(
            schedule_kind(self.pipeline_schedule), device_mesh["pp"].get_local_rank(), pp, stages_per_rank
        )
        keep_stages(module, split, own)
        replicas, shards = device_mesh["dp_replicate"].size(), device_mesh["dp_shard"].size()
        if replicas * shards > 1:
            mesh = device_mesh["dp_replicate", "dp_shard"] if replicas > 1 else device_mesh["dp_shard"]
            for stage in own:
                self._shard_stage(
                    module, stage_view(module, split, stage), split, stage, mesh, self._fully_shard_kwargs
                )
        return module

    def _make_engine(self) -> PipelineEngine:
        assert self._split is not None
        kind = schedule_kind(self.pipeline_schedule)
        layout = self._resolved_layout
        own = rank_stages(kind, layout.pipeline_rank(self.global_rank), self.pp, self.stages_per_rank)
        return PipelineEngine(
            self._views,
            own,
            self._split.num_stages,
            kind,
            self.device_mesh["pp"].get_group(),
            self.root_device,
            eval_micro_batches=self.micro_batches,
        )

    @property
    def pipeline_engine(self) -> PipelineEngine:
        if self._engine is None:
            raise RuntimeError("The pipeline strategy builds its stages in setup_module().")
        return self._engine

    def setup_optimizers(self, optimizers: list[Optimizer]) -> list[Optimizer]:
        self._optimizers = super().setup_optimizers(optimizers)
        return self._optimizers

    def rebuild_dataloader(self, loader: Iterable[Any], stage: LoaderStage) -> Iterable[Any]:
        # Accumulating k batches is one schedule call over their micro-batches, k times as many.
        accumulate = self.loop_settings.accumulate_grad_batches
        return BatchWindows(loader, accumulate) if stage == "fit" and accumulate > 1 else loader

    # -- steps ------------------------------------------------------------------------------

    @property
    def optimizer_steps_per_call(self) -> int:
        return 1

    def run_training_steps(self, batch: Any, batch_idx: int) -> EngineSteps:
        engine = self.pipeline_engine
        module = self.module
        settings = self.loop_settings
        window = batch if settings.accumulate_grad_batches > 1 else [batch]
        pairs = [_inputs_and_target(module, item) for item in window]
        micro_batches = sum(self._micro_batches_of(inputs) for inputs, _ in pairs)
        inputs, target = _joined(pairs)
        self._follow_mode(module)
        with self.precision.forward_context():
            loss = engine.train_step(inputs, target, getattr(module, _LOSS_HOOK), micro_batches)
        if len(window) < settings.accumulate_grad_batches:
            # A window cut short by the epoch's end: its gradient is the sum of its batches' over the full
            # window's length, as the Trainer accumulates (the schedule gave their mean).
            _scale_gradients(self._optimizers, len(window) / settings.accumulate_grad_batches)
        for optimizer in self._optimizers:
            if settings.gradient_clip_val is not None:
                self._clip(optimizer, settings.gradient_clip_val, settings.gradient_clip_algorithm)
            self.precision.optimizer_step(optimizer, optimizer.step)
            optimizer.zero_grad(set_to_none=True)
        if self.log_loss_as is not None:
            # training_step does not run, so nothing else logs the step's loss; every rank has it.
            cast(Any, module).log(self.log_loss_as, loss, prog_bar=True)
        return EngineSteps(output=loss, optimizer_steps=1)

    def _micro_batches_of(self, inputs: tuple[Any, ...]) -> int:
        size = next((value.shape[0] for value in inputs if isinstance(value, torch.Tensor)), None)
        count = self.micro_batches
        if self.micro_batch_size is not None and size is not None:
            count = size // self.micro_batch_size
        if size is None or size % count or count == 0:
            raise ValueError(
                f"A training batch of {size} samples is not divisible into {count} micro-batches"
                f"{f' of micro_batch_size={self.micro_batch_size}' if self.micro_batch_size else ''}. Give the "
                "DataLoader drop_last=True, or a dataset whose size the batch size divides."
            )
        return count

    def _clip(self, optimizer: Optimizer, clip_val: float, algorithm: Literal["norm", "value"]) -> None:
        parameters = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if algorithm == "value":
            torch.nn.utils.clip_grad_value_(parameters, clip_val)
            return
        clip_gradients_by_norm(parameters, clip_val, split_over=self.device_mesh["pp"].get_group())

    def clip_gradients(
        self, optimizer: Optimizer, clip_val: float, algorithm: Literal["norm", "value"] = "norm"
    ) -> torch.Tensor | None:
        raise RuntimeError("The pipeline strategy clips inside its training step (gradient_clip_val).")

    def backward(self, loss: torch.Tensor, optimizer: Optimizer | None) -> None:
        raise RuntimeError("The pipeline strategy runs backward inside its schedule.")

    def optimizer_step(self, optimizer: Optimizer) -> Any:
        raise RuntimeError("The pipeline strategy steps the optimizers inside its training step.")

    def run_step(self, step_name: str, *args: Any) -> Any:
        if step_name == "training_step":
            raise RuntimeError("The pipeline strategy runs training steps through its schedule (run_training_steps).")
        module = self.module
        engine = self.pipeline_engine
        self._follow_mode(module)
        own_forward = module.__dict__.get("forward")
        module.forward = engine.forward  # type: ignore[method-assign]
        try:
            with self.precision.forward_context():
                return getattr(module, step_name)(*args)
        finally:
            if own_forward is None:
                module.__dict__.pop("forward", None)
            else:
                module.forward = own_forward  # type: ignore[method-assign]

    def _follow_mode(self, module: nn.Module) -> None:
        # The stages are copies of the module's holders: they follow its train() / eval().
        for view in self._views:
            for _, view_holder in holder_pairs(module, view, self._configured_split):
                view_holder.training = module.training

    @property
    def _configured_split(self) -> StageSplit:
        if self._split is None:
            raise RuntimeError("The pipeline strategy cuts the module in setup_module().")
        return self._split

    # -- checkpoints ------------------------------------------------------------------------

    def _state_of_sharded(self, value: Any) -> Any:
        state = super()._state_of_sharded(value)
        if isinstance(value, Optimizer):
            state = {**state, "param_groups": self._whole_model_groups(state["param_groups"])}
        return state

    def _whole_model_groups(self, groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Every stage's parameter names in each group, in the whole model's order: what one process's optimizer
        over the whole module holds, so that a reader of any layout finds every parameter's state."""
        gathered: list[Any] = [None] * dist.get_world_size(self._pp_group)
        dist.all_gather_object(gathered, groups, group=self._pp_group)
        position = {name: index for index, name in enumerate(self._whole_model_order)}
        merged = []
        for index, group in enumerate(groups):
            names = {name for stage_groups in gathered for name in stage_groups[index]["params"]}
            merged.append({**group, "params": sorted(names, key=lambda name: position.get(name, math.inf))})
        return merged

    @property
    def _pp_group(self) -> Any:
        return self.device_mesh["pp"].get_group()

    def _load_state(self, target: Any, value: Any, options: StateDictOptions, index_keyed: bool = False) -> None:
        if isinstance(target, Optimizer) and value and not index_keyed:
            own = set(parameter_names(self.module, target))
            groups = [
                {**group, "params": [name for name in group["params"] if name in own]}
                for group in value["param_groups"]
            ]
            value = {**value, "param_groups": groups}
        super()._load_state(target, value, options, index_keyed)

    def _load_whole_checkpoint(
        self, path: Path, targets: dict[str, Any], strict: bool, weights_only: bool
    ) -> dict[str, Any]:
        """Every rank reads the whole file (one process's checkpoint) and keeps its stages' entries."""
        checkpoint = LazyCheckpoint.shallow_copy(
            read_full_checkpoint(path, self.checkpoint_io, weights_only, required=list(targets))
        )
        options = StateDictOptions(full_state_dict=True, strict=False)
        own_names = set(get_model_state_dict(self.module))
        for key, target in targets.items():
            value = checkpoint.pop(key)
            if isinstance(target, nn.Module):
                state = strip_compile_prefix(value)
                missing = sorted(own_names - set(state))
                if strict and missing:
                    raise KeyError(f"The checkpoint at {str(path)!r} has no {', '.join(missing[:5])}.")
                set_model_state_dict(
                    target, {name: state[name] for name in own_names if name in state}, options=options
                )
            else:
                for optimizer, state in zip(_as_list(target), _as_list(value), strict=True):
                    self._load_whole_optimizer(optimizer, state, options)
        return checkpoint

    def _load_whole_optimizer(self, optimizer: Optimizer, state: dict[str, Any], options: StateDictOptions) -> None:
        """A one-process optimizer state numbers the whole model's parameters in order; keep this rank's."""
        named = to_name_keyed(state, self._whole_model_order)
        own = parameter_names(self.module, optimizer)
        own_set = set(own)
        groups = [
            {**group, "params": [name for name in group["params"] if name in own_set]}
            for group in named["param_groups"]
        ]
        kept: dict[str, Any] = {
            "state": {name: value for name, value in named["state"].items() if name in own_set},
            "param_groups": groups,
        }
        set_optimizer_state_dict(self.module, optimizer, kept, options=options)

    def module_full_state_dict(self) -> dict[str, Any]:
        full: dict[str, Any] = get_model_state_dict(self.module, options=StateDictOptions(full_state_dict=True))
        own = {name: value.detach().cpu().clone() for name, value in full.items()}
        gathered: list[Any] = [None] * dist.get_world_size() if self.is_global_zero else []
        dist.gather_object(own, gathered if self.is_global_zero else None, dst=0)
        if not self.is_global_zero:
            return {}
        whole: dict[str, Any] = {}
        for part in gathered:
            whole.update(part)
        return whole

    def teardown(self) -> None:
        super().teardown()
        self._engine = None

    def __repr__(self) -> str:
        return (
            f"PipelineStrategy({self._mesh_layout}, pipeline_schedule={self.pipeline_schedule!r}, "
            f"micro_batches={self.micro_batches}, stages_per_rank={self.stages_per_rank}, "
            f"devices={self.num_processes}, num_nodes={self.num_nodes})"
        )


def _submodule_or_none(module: nn.Module, name: str) -> nn.Module | None:
    try:
        return module.get_submodule(name)
    except AttributeError:
        return None


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else [value]


def _joined(pairs: list[tuple[tuple[Any, ...], Any]]) -> tuple[tuple[Any, ...], Any]:
    """Several batches' inputs and targets as one batch (concatenated along the batch dimension)."""
    if len(pairs) == 1:
        return pairs[0]
    inputs = tuple(torch.cat(parts) for parts in zip(*(inputs for inputs, _ in pairs), strict=True))
    return inputs, torch.cat([target for _, target in pairs])


def _scale_gradients(optimizers: list[Optimizer], factor: float) -> None:
    with torch.no_grad():
        for optimizer in optimizers:
            for group in optimizer.param_groups:
                for parameter in group["params"]:
                    if parameter.grad is not None:
                        parameter.grad.mul_(factor)


def _inputs_and_target(module: nn.Module, batch: Any) -> tuple[tuple[Any, ...], Any]:
    split = getattr(module, _BATCH_HOOK, None)
    pair = split(batch) if callable(split) else batch
    if not isinstance(pair, list | tuple) or len(pair) != 2:
        raise TypeError(
            f"The pipeline strategy trains on (inputs, target) batches; got {type(pair).__name__}. Define "
            f"{type(module).__name__}.{_BATCH_HOOK}(batch) returning (inputs, target), inputs a tensor or a tuple."
        )
    inputs, target = pair
    return (tuple(inputs) if isinstance(inputs, tuple) else (inputs,)), target
