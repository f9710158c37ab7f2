"""DDP communication hooks: combinations refused before launch, and registration on the wrapped module.

What is refused, and why (torch 2.13, gloo, seen on CPU):

- ``bf16_compress_hook`` / ``bf16_compress_wrapper`` need NCCL 2.10+ with CUDA.
- ``powerSGD_hook`` with several gradient buckets makes the ranks' collectives mismatch on
  gloo and aborts the processes; one bucket (``bucket_cap_mb`` above the gradient size) works.
- ``batched_powerSGD_hook`` fails an assertion on gloo.
- ``post_localSGD_hook`` with ``subgroup=None`` sizes its subgroups by the CUDA device count.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn
from torch.nn.parallel import DistributedDataParallel

CommHook = Callable[[Any, Any], Any]


def check_comm_hook_options(
    *,
    hook: CommHook | None,
    wrapper: Callable[[CommHook], CommHook] | None,
    state: Any,
    backend: str,
    bucket_cap_mb: float | None,
    model_averaging_period: int | None,
) -> None:
    """Raise ``ValueError`` for a hook option or combination that cannot work with ``backend``."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, post_localSGD_hook, powerSGD_hook

    if hook is None:
        for option, value in (
            ("ddp_comm_wrapper", wrapper),
            ("ddp_comm_state", state),
            ("model_averaging_period", model_averaging_period),
        ):
            if value is not None:
                raise ValueError(f"{option}={value!r} only applies with a ddp_comm_hook, but ddp_comm_hook=None.")
        return
    on_nccl = "nccl" in backend
    if not on_nccl and (hook is default_hooks.bf16_compress_hook or wrapper is default_hooks.bf16_compress_wrapper):
        option = "ddp_comm_hook" if hook is default_hooks.bf16_compress_hook else "ddp_comm_wrapper"
        raise ValueError(
            f"{option}={_name(hook if option == 'ddp_comm_hook' else wrapper)} needs NCCL 2.10+ with CUDA, but "
            f"process_group_backend={backend!r}. Use fp16_compress_hook or fp16_compress_wrapper instead."
        )
    if backend == "gloo" and hook is powerSGD_hook.batched_powerSGD_hook:
        raise ValueError(
            "ddp_comm_hook=batched_powerSGD_hook fails on process_group_backend='gloo'. Use powerSGD_hook "
            "with bucket_cap_mb larger than the model's gradients in MiB (e.g. bucket_cap_mb=1000)."
        )
    if backend == "gloo" and hook is powerSGD_hook.powerSGD_hook and bucket_cap_mb is None:
        raise ValueError(
            "ddp_comm_hook=powerSGD_hook on process_group_backend='gloo' needs every gradient in one bucket: "
            "with several, the ranks' collectives mismatch and the processes abort. Pass bucket_cap_mb larger "
            "than the model's gradients in MiB (e.g. bucket_cap_mb=1000); bucket_cap_mb=None uses 25 MiB buckets."
        )
    is_post_local_sgd = hook is post_localSGD_hook.post_localSGD_hook
    if is_post_local_sgd and model_averaging_period is None:
        raise ValueError(
            "ddp_comm_hook=post_localSGD_hook needs model_averaging_period (average the models every N steps "
            "once local SGD starts), e.g. model_averaging_period=4."
        )
    if not is_post_local_sgd and model_averaging_period is not None:
        raise ValueError(
            f"model_averaging_period={model_averaging_period!r} is for ddp_comm_hook=post_localSGD_hook, but "
            f"ddp_comm_hook={_name(hook)}."
        )
    if is_post_local_sgd:
        if state is None:
            raise ValueError(
                "ddp_comm_hook=post_localSGD_hook needs ddp_comm_state: a PostLocalSGDState, or a function without "
                "arguments that builds one in each rank (after the process group exists)."
            )
        if not callable(state):
            check_post_local_sgd_state(state, backend)


def check_post_local_sgd_state(state: Any, backend: str) -> None:
    """Refuse a post-localSGD state whose default subgroup would need CUDA."""
    if getattr(state, "subgroup", None) is None and "nccl" not in backend:
        raise ValueError(
            "ddp_comm_state=PostLocalSGDState(subgroup=None, ...) makes one subgroup per machine sized by the CUDA "
            f"device count, which fails with process_group_backend={backend!r}. Pass ddp_comm_state as a function "
            "that builds the state in each rank once the process group exists, for example\n"
            "    def local_sgd_state():\n"
            "        subgroup, _ = torch.distributed.new_subgroups(group_size=1)\n"
            "        return PostLocalSGDState(process_group=None, subgroup=subgroup, start_localSGD_iter=8)\n"
            "    DDPStrategy(ddp_comm_state=local_sgd_state, ddp_comm_hook=post_localSGD_hook, "
            "model_averaging_period=4)"
        )


def build_comm_state(state: Any, hook: CommHook | None, backend: str) -> Any:
    """The hook's state in this rank: ``state`` itself, or what it returns when it is a function."""
    built = state() if callable(state) else state
    from torch.distributed.algorithms.ddp_comm_hooks import post_localSGD_hook

    if hook is post_localSGD_hook.post_localSGD_hook:
        check_post_local_sgd_state(built, backend)
    return built


def check_single_bucket(module: nn.Module, hook: CommHook | None, backend: str, bucket_cap_mb: float | None) -> None:
    """Refuse powerSGD on gloo when this module's gradients do not fit ``bucket_cap_mb``."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    if backend != "gloo" or hook is not powerSGD_hook.powerSGD_hook or bucket_cap_mb is None:
        return
    gradient_mib = sum(p.numel() * p.element_size() for p in module.parameters() if p.requires_grad) / 2**20
    if gradient_mib > bucket_cap_mb:
        raise ValueError(
            f"ddp_comm_hook=powerSGD_hook on gloo needs one gradient bucket, but this module's gradients take "
            f"{gradient_mib:.1f} MiB and bucket_cap_mb={bucket_cap_mb}. Pass bucket_cap_mb={int(gradient_mib) + 1} "
            "or more."
        )


def register_comm_hook(
    model: DistributedDataParallel,
    state: Any,
    hook: CommHook | None,
    wrapper: Callable[[CommHook], CommHook] | None,
) -> None:
    if hook is None:
        return
    model.register_comm_hook(state=state, hook=wrapper(hook) if wrapper is not None else hook)


def create_model_averager(state: Any, period: int) -> Any:
    """A periodic model averager that starts with local SGD (``state.start_localSGD_iter``)."""
    from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager

    return PeriodicModelAverager(period=period, warmup_steps=state.start_localSGD_iter)


def _name(function: Any) -> str:
    return getattr(function, "__qualname__", repr(function))
